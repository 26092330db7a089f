/*
 * test_journal.c - the delivery journal (store/journal.h, spool_sync:
 * journal), on real mailboxes in a fresh directory per case:
 *
 *   format     one delivery = one record at segment 0 + 4096 with the
 *              documented header (magic, length, generation, sequence 1,
 *              CRC-32C of all but the message, the message's offset), the
 *              entry fields with the message's SHA-1 and the message
 *              bytes; no
 *              syncfs(), one journal round; the file is filled to
 *              one MiB (zeros written ahead), zeros beyond the record
 *   torn       a damaged second record ends the replay: the first is
 *              restored, the third is not (a byte of its message: the
 *              entry's SHA-1 finds it)
 *   background checkpoint  the delivery that switches segments returns
 *              while the checkpoint of the segment left is still held
 *              (journal_test_hold_checkpoint); let go, it completes in a
 *              thread (counted, the segment reused afterwards)
 *   readback   a message over 64 KiB (not kept in memory): read back
 *              from the staged file, its bytes under the record's CRC
 *              (field 36 zero), restored by replay; a damaged entry of a
 *              SHA-1-covered record ends the run
 *   lost       every message file deleted and cyrus.index put back to its
 *              state before the deliveries (writes lost): replay restores
 *              files byte for byte and records (uid, digest, size,
 *              internal date, flags, keywords); a second replay changes
 *              nothing
 *   truncated  cyrus.index cut in the middle of its records (the header
 *              still counting them): replay rebuilds the index and the
 *              flags and keywords of the lost records
 *   wrap       1 MiB segments, 60 messages of ~60 KB: segments reused
 *              after checkpoints (syncfs counted), records of the last
 *              segment replayed, everything readable
 *   procs      4 processes x 25 deliveries into one shared and one own
 *              mailbox each at once: every record in the journal, fewer
 *              rounds than records possible, replay after all files are
 *              deleted restores all 200 copies
 *   failure    a failed round: 4xx (STORE_IOERROR), the uid aborted, the
 *              journal given up (the next delivery goes the group way);
 *              records waiting for replay at the start of a boot (a new
 *              commit.shm) keep the journal unused until journal_replay()
 *   expunged   a message expunged and cleaned up after its record was
 *              written is not brought back by replay
 *   lost finish  the finish's record rewrite lost under a header that
 *              counts the message: the mailbox's recovery repairs it (the
 *              finish in journal mode does not raise `synced`)
 *   uid reused the loss took uidnext and a delivery before the replay
 *              got the journaled uid: both messages kept, the journaled
 *              one under a new uid
 *   torn files an index record in the visible prefix lost (a zero
 *              sector: recovery refuses, replay rebuilds), the journaled
 *              message's file torn to half, another one's empty, and the
 *              torn and the empty file of two deliveries never
 *              acknowledged: replay writes the journaled files from the
 *              journal, the rebuilt index has them with their flags, and
 *              the unacknowledged files are neither messages nor left
 *   placeholder a record beyond the visible prefix lost before an intact
 *              one: recovery makes it an aborted placeholder and unlinks
 *              the file; replay rebuilds and the message keeps its uid
 *              (uidnext not moved, nothing restored under a new uid)
 *   dead writer a process killed after reserving its record and before
 *              writing it (journal_test_die_reserved): the next delivery
 *              is not held up (within 60 s) and succeeds through the
 *              journal, the dead writer's bytes are a filler (a valid
 *              record without entries), and replay goes on past it to the
 *              next record
 *   synced     300 deliveries to one mailbox: the index's `synced` mark
 *              (read from cyrus.index's current header slot) follows at
 *              most 128 records behind, so the recovery of each exclusive
 *              lock does not re-read every record since the last group
 *              round; all 300 went through the journal, no syncfs()
 *   tail cut   the last record's sector lost while the header that counts
 *              it reached the disk (visible before it): the recovery cuts
 *              the record off and unlinks the file replay had restored;
 *              replay writes it again before the rebuild, nothing lost
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include <openssl/evp.h>

#include "lib/buf.h"
#include "lib/crc32c.h"
#include "lib/fsutil.h"
#include "lib/imapconf.h"
#include "store/append.h"
#include "store/commit.h"
#include "store/journal.h"
#include "store/mailbox.h"
#include "store/store.h"
#include "tests/testhelp.h"


#define TJ_BACKEND "skiplist"
#define TJ_CONF "spool_sync: journal\njournal_size: 1048576\n"
#define TJ_SEG 1048576u

struct tj_fix {
    char *dir;
    char *spool;
    struct imapconf *conf;
};

static void tj_setup(struct tj_fix *f, const char *tag, const char *extra)
{
    struct buf b = BUF_INITIALIZER;

    buf_printf(&b, "%s%s", TJ_CONF, extra ? extra : "");
    f->dir = th_mkdtemp(tag);
    f->spool = th_path(f->dir, "spool");
    f->conf = th_store_conf(f->dir, TJ_BACKEND, buf_cstring(&b));
    buf_free(&b);
}

static void tj_teardown(struct tj_fix *f)
{
    imapconf_free(&f->conf);
    th_rmrf(f->dir);
    free(f->dir);
    free(f->spool);
}

static char *tj_journal_path(struct tj_fix *f)
{
    struct buf b = BUF_INITIALIZER;

    buf_printf(&b, "%s/%s/%s", f->spool, JOURNAL_DIR, JOURNAL_FNAME);
    return buf_release(&b);
}

static struct mailbox *tj_create(struct tj_fix *f, const char *name)
{
    struct mailbox *mb = NULL;
    char uniq[64];

    snprintf(uniq, sizeof(uniq), "u%08lx", (unsigned long)random());
    assert_int_equal(mailbox_create(f->conf, name, NULL, uniq, 0), STORE_OK);
    assert_int_equal(mailbox_open(f->conf, name, NULL, &mb), STORE_OK);
    return mb;
}

/* Message n of about `size` bytes. */
static void tj_message(struct buf *m, unsigned n, size_t size)
{
    size_t k;

    buf_reset(m);
    buf_printf(m, "From: a@example.org\r\nSubject: journal %u\r\n\r\n", n);
    for (k = 0; (m)->len < size; k++) {
        if (k % 72 == 70)
            buf_append(m, "\r\n", 2);
        else
            buf_putc(m, 'a' + (int)((n * 7 + k * 13) % 26));
    }
    buf_append(m, "\r\n", 2);
}

/* Deliver m to the n mailboxes; STORE_OK or the commit's code. */
static int tj_deliver(struct tj_fix *f, struct mailbox **mbs, size_t n,
                      const struct buf *m, uint32_t sysflags,
                      const char *const *kw, size_t nkw, uint32_t *uids)
{
    struct append_stage *st = NULL;
    struct append_txn *t = NULL;
    size_t i;
    int r;

    assert_int_equal(append_stage_open(f->conf, NULL, &st), STORE_OK);
    assert_int_equal(append_stage_write(st, (m)->s, (m)->len),
                     STORE_OK);
    assert_int_equal(append_stage_close(st), STORE_OK);
    assert_int_equal(append_begin(f->conf, &t), STORE_OK);
    for (i = 0; i < n; i++)
        assert_int_equal(append_add_keywords(t, mbs[i], st, 1700000000 + i,
                                             sysflags, kw, nkw,
                                             APPEND_IGNORE_QUOTA,
                                             uids ? &uids[i] : NULL),
                         STORE_OK);
    r = append_commit(t);
    append_free(&t);
    append_stage_free(&st);
    return r;
}

static void tj_read_file(const char *path, struct buf *out)
{
    char chunk[65536];
    ssize_t n;
    int fd = open(path, O_RDONLY);

    buf_reset(out);
    assert_true(fd >= 0);
    while ((n = read(fd, chunk, sizeof(chunk))) > 0)
        buf_append(out, chunk, (size_t)n);
    close(fd);
}

/* mb's message uid equals m, byte for byte. */
static void tj_check_file(struct mailbox *mb, uint32_t uid,
                          const struct buf *m)
{
    struct buf path = BUF_INITIALIZER, got = BUF_INITIALIZER;

    mailbox_message_path(mb, uid, &path);
    tj_read_file(buf_cstring(&path), &got);
    assert_int_equal((&got)->len, (m)->len);
    assert_memory_equal((&got)->s, (m)->s, (m)->len);
    buf_free(&path);
    buf_free(&got);
}

static void tj_unlink_file(struct mailbox *mb, uint32_t uid)
{
    struct buf path = BUF_INITIALIZER;

    mailbox_message_path(mb, uid, &path);
    assert_int_equal(unlink(buf_cstring(&path)), 0);
    buf_free(&path);
}

/* The visible record of uid (exclusive lock, so recovery runs). */
static int tj_record(struct mailbox *mb, uint32_t uid,
                     struct mailbox_record *rec)
{
    uint32_t recno;
    int r;

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    r = mailbox_find_uid(mb, uid, &recno);
    if (r == STORE_OK)
        r = mailbox_read_record(mb, recno, rec);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    return r;
}

static void tj_copy(const char *from, const char *to)
{
    struct buf b = BUF_INITIALIZER;
    int fd;

    tj_read_file(from, &b);
    fd = open(to, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(fs_write_all(fd, (&b)->s, (&b)->len), 0);
    close(fd);
    buf_free(&b);
}

static uint32_t le32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t le64(const unsigned char *p)
{
    return (uint64_t)le32(p) | ((uint64_t)le32(p + 4) << 32);
}

static void tj_shared(struct tj_fix *f, struct commit_shared_stats *s)
{
    assert_int_equal(commit_shared_stats(f->conf, s), STORE_OK);
}

static void tj_sha1(const void *p, size_t n, unsigned char *md)
{
    unsigned int mdlen = 0;

    assert_int_equal(EVP_Digest(p, n, md, &mdlen, EVP_sha1(), NULL), 1);
    assert_int_equal(mdlen, 20);
}

/* ---- cases ---------------------------------------------------------------- */

static void test_format(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER, j = BUF_INITIALIZER;
    struct commit_shared_stats s;
    const char *kw[] = { "$Label1" };
    const unsigned char *rec, *p;
    uint32_t uid, len, crc, moff;
    unsigned char saved[4];
    char *jpath;
    size_t i;

    (void)state;
    tj_setup(&f, "jfmt", NULL);
    mb = tj_create(&f, "user.alice");
    tj_message(&m, 1, 3000);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, MAILBOX_FLAG_SEEN, kw, 1,
                                &uid), STORE_OK);
    assert_int_equal(uid, 1);
    tj_shared(&f, &s);
    assert_int_equal(s.journal_records, 1);
    assert_true(s.journal_syncs >= 1);
    assert_int_equal(s.syncfs_calls, 0);
    assert_int_equal(s.file_syncs, 0);

    jpath = tj_journal_path(&f);
    tj_read_file(jpath, &j);
    assert_int_equal((&j)->len, 1048576);   /* zeros written 1 MiB ahead */
    p = (const unsigned char *)(&j)->s;
    assert_memory_equal(p, "CDJNL001", 8);
    assert_memory_equal(p + 4096, "CDJSEG01", 8);
    rec = p + 4096 + 4096;
    assert_int_equal(le32(rec), 0x524a4443u);
    len = le32(rec + 4);
    assert_int_equal(len % 16, 0);
    assert_int_equal(le64(rec + 8), le64(p + 4096 + 8));  /* generation */
    assert_int_equal(le64(rec + 16), 1);                  /* sequence */
    assert_int_equal(le32(rec + 24), 1);                  /* entries */
    assert_int_equal(le32(rec + 28), (&m)->len);
    /* the message bytes at the offset field 36 gives, right after the
     * entry, covered by the entry's SHA-1 (written from the stage's
     * buffer); the CRC-32C covers the rest with its own field as zero */
    moff = le32(rec + 36);
    assert_int_equal(moff, 40 + 58 + (rec[92] | rec[93] << 8) +
                           (rec[94] | rec[95] << 8) + 2 + 7);
    assert_memory_equal(rec + moff, (&m)->s, (&m)->len);
    assert_int_equal(len, (moff + (&m)->len + 15) / 16 * 16);
    memcpy(saved, rec + 32, 4);
    crc = le32(saved);
    {
        unsigned char *copy = malloc(len), md[20];

        memcpy(copy, rec, len);
        memset(copy + 32, 0, 4);
        memmove(copy + moff, copy + moff + (&m)->len,
                len - moff - (&m)->len);
        assert_int_equal(crc32c(copy, len - (&m)->len), crc);
        free(copy);
        tj_sha1((&m)->s, (&m)->len, md);
        assert_memory_equal(rec + 40 + 32, md, 20);
    }
    /* entry: uid, flags, names; then the message */
    assert_int_equal(le32(rec + 40), 1);
    assert_int_equal(le32(rec + 40 + 12), MAILBOX_FLAG_SEEN);
    assert_int_equal(le32(rec + 40 + 24), (&m)->len);
    assert_non_null(memmem(rec, len, "user.alice", 10));
    assert_non_null(memmem(rec, len, "$Label1", 7));
    assert_non_null(memmem(rec, len, (&m)->s, (&m)->len));
    /* nothing after it */
    for (i = 4096 + 4096 + len; i < (&j)->len; i++)
        if (p[i])
            fail_msg("byte %zu after the record is not zero", i);
    free(jpath);
    buf_free(&j);
    buf_free(&m);
    mailbox_close(&mb);
    tj_teardown(&f);
}

/* Wait up to 60 s for a byte on fd; 1 when it came. */
static int tj_wait_byte(int fd)
{
    struct pollfd pfd = { .fd = fd, .events = POLLIN };
    char c;

    if (poll(&pfd, 1, 60000) != 1)
        return 0;
    return read(fd, &c, 1) == 1;
}

#define TJ_BG 20

/* The delivery that switches segments does not wait for the checkpoint
 * of the segment it left: with every checkpoint held (a pipe nobody
 * writes yet), a child delivers TJ_BG messages of 60 KB through 1 MiB
 * segments (one switch after ~17) and says so; only then is the
 * checkpoint let go, and it completes in the background (counted, the
 * segment free again: the parent's deliveries wrap back into it). */
static void test_background_checkpoint(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER;
    struct commit_shared_stats s;
    int hold[2], said[2], status, i, ok;
    pid_t pid;

    (void)state;
    tj_setup(&f, "jbgck", NULL);
    mb = tj_create(&f, "user.bert");
    assert_int_equal(pipe(hold), 0);
    assert_int_equal(pipe(said), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *own = NULL;
        int bad = 0;

        close(hold[1]);
        close(said[0]);
        if (mailbox_open(f.conf, "user.bert", NULL, &own) != STORE_OK)
            _exit(2);
        journal_test_hold_checkpoint(hold[0]);
        for (i = 0; i < TJ_BG && !bad; i++) {
            tj_message(&m, (unsigned)i, 60000);
            if (tj_deliver(&f, &own, 1, &m, 0, NULL, 0, NULL) != STORE_OK)
                bad = 1;
        }
        if (write(said[1], bad ? "x" : "k", 1) != 1)
            bad = 1;
        journal_checkpoints_wait();
        _exit(bad);
    }
    close(hold[0]);
    close(said[1]);
    ok = tj_wait_byte(said[0]);
    tj_shared(&f, &s);
    /* let the checkpoint go whatever happened, then reap */
    assert_int_equal(write(hold[1], "g", 1), 1);
    if (!ok)
        kill(pid, SIGKILL);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(ok);    /* all delivered while the checkpoint was held */
    assert_int_equal(s.journal_records, TJ_BG);
    assert_int_equal(s.checkpoints, 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    tj_shared(&f, &s);
    assert_int_equal(s.checkpoints, 1);
    /* segment 0 was freed: wrap back into it */
    for (i = 0; i < TJ_BG; i++) {
        tj_message(&m, 100 + (unsigned)i, 60000);
        assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, NULL),
                         STORE_OK);
    }
    journal_checkpoints_wait();
    tj_shared(&f, &s);
    assert_int_equal(s.journal_records, 2 * TJ_BG);
    assert_int_equal(s.checkpoints, 2);
    assert_int_equal(s.syncfs_calls, 0);
    close(hold[1]);
    close(said[0]);
    mailbox_close(&mb);
    buf_free(&m);
    tj_teardown(&f);
}

/* A message bigger than the stage's buffer (64 KiB) was written out
 * while it came in: the record reads it back from the staged file and its
 * CRC covers the bytes (field 36 zero); replay restores it.  A byte of
 * the entry of a record whose message the SHA-1 covers, changed, makes
 * that record and the ones after it invalid (the CRC covers the entry). */
/* The file header's version: 2 is written; a version-1 file is read (and
 * rewritten as 2 by the replay's checkpoint); a later version is refused
 * rather than misread. */
static void tj_set_version(const char *jpath, uint32_t v)
{
    unsigned char hdr[36];
    uint32_t crc;
    int fd = open(jpath, O_RDWR);

    assert_true(fd >= 0);
    assert_int_equal(pread(fd, hdr, sizeof(hdr), 0), (ssize_t)sizeof(hdr));
    hdr[8] = (unsigned char)v;
    hdr[9] = hdr[10] = hdr[11] = 0;
    crc = crc32c(hdr, 32);
    hdr[32] = (unsigned char)crc;
    hdr[33] = (unsigned char)(crc >> 8);
    hdr[34] = (unsigned char)(crc >> 16);
    hdr[35] = (unsigned char)(crc >> 24);
    assert_int_equal(pwrite(fd, hdr, sizeof(hdr), 0), (ssize_t)sizeof(hdr));
    close(fd);
}

static void test_version(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER, j = BUF_INITIALIZER;
    struct journal_replay_stats st;
    uint32_t uid;
    char *jpath;

    (void)state;
    tj_setup(&f, "jvers", NULL);
    mb = tj_create(&f, "user.vera");
    tj_message(&m, 1, 3000);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uid), STORE_OK);
    jpath = tj_journal_path(&f);
    tj_read_file(jpath, &j);
    assert_int_equal(le32((const unsigned char *)(&j)->s + 8), 2);

    /* a newer version than this binary knows: nothing replayed, refused */
    tj_set_version(jpath, 3);
    tj_unlink_file(mb, uid);
    mailbox_close(&mb);
    assert_int_not_equal(journal_replay(f.conf, NULL, &st), STORE_OK);

    /* version 1: read, the message restored, the header now says 2 */
    tj_set_version(jpath, 1);
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.files_written, 1);
    tj_read_file(jpath, &j);
    assert_int_equal(le32((const unsigned char *)(&j)->s + 8), 2);
    assert_int_equal(mailbox_open(f.conf, "user.vera", NULL, &mb), STORE_OK);
    tj_check_file(mb, uid, &m);
    mailbox_close(&mb);
    free(jpath);
    buf_free(&j);
    buf_free(&m);
    tj_teardown(&f);
}

static void test_readback(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m[3] = { BUF_INITIALIZER, BUF_INITIALIZER, BUF_INITIALIZER };
    struct buf j = BUF_INITIALIZER;
    struct journal_replay_stats st;
    const unsigned char *rec;
    unsigned char *copy;
    uint32_t uids[3], len, len1;
    char *jpath;
    int fd, i;

    (void)state;
    tj_setup(&f, "jrdbk", NULL);
    mb = tj_create(&f, "user.rita");
    tj_message(&m[0], 0, 100000);
    tj_message(&m[1], 1, 3000);
    tj_message(&m[2], 2, 3000);
    for (i = 0; i < 3; i++)
        assert_int_equal(tj_deliver(&f, &mb, 1, &m[i], 0, NULL, 0, &uids[i]),
                         STORE_OK);
    jpath = tj_journal_path(&f);
    tj_read_file(jpath, &j);
    rec = (const unsigned char *)(&j)->s + 8192;
    len = le32(rec + 4);
    assert_int_equal(le32(rec + 28), (&m[0])->len);
    assert_int_equal(le32(rec + 36), 0);
    copy = malloc(len);
    memcpy(copy, rec, len);
    memset(copy + 32, 0, 4);
    assert_int_equal(crc32c(copy, len), le32(rec + 32));
    free(copy);
    assert_non_null(memmem(rec, len, (&m[0])->s, (&m[0])->len));
    /* the second record: SHA-1 covered; damage its entry (the uid) */
    len1 = le32(rec + len + 4);
    assert_true(le32(rec + len + 36) != 0);
    fd = open(jpath, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "\x7f", 1, 8192 + len + 40 + 1), 1);
    close(fd);
    (void)len1;
    for (i = 0; i < 3; i++)
        tj_unlink_file(mb, uids[i]);
    mailbox_close(&mb);
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.files_written, 1);
    assert_int_equal(mailbox_open(f.conf, "user.rita", NULL, &mb), STORE_OK);
    tj_check_file(mb, uids[0], &m[0]);
    free(jpath);
    buf_free(&j);
    for (i = 0; i < 3; i++)
        buf_free(&m[i]);
    mailbox_close(&mb);
    tj_teardown(&f);
}

static void test_torn(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m[3] = { BUF_INITIALIZER, BUF_INITIALIZER, BUF_INITIALIZER };
    struct journal_replay_stats st;
    uint32_t uids[3];
    struct stat sb;
    struct buf path = BUF_INITIALIZER;
    unsigned char hdr[8];
    char *jpath;
    uint32_t len0;
    int fd, i;

    (void)state;
    tj_setup(&f, "jtorn", NULL);
    mb = tj_create(&f, "user.bob");
    for (i = 0; i < 3; i++) {
        tj_message(&m[i], (unsigned)i, 2000);
        assert_int_equal(tj_deliver(&f, &mb, 1, &m[i], 0, NULL, 0, &uids[i]),
                         STORE_OK);
    }
    /* tear the second record: one byte of its message */
    jpath = tj_journal_path(&f);
    fd = open(jpath, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, hdr, 8, 8192), 8);
    len0 = le32(hdr + 4);
    assert_int_equal(pwrite(fd, "\xff", 1, 8192 + len0 + 200), 1);
    close(fd);
    for (i = 0; i < 3; i++)
        tj_unlink_file(mb, uids[i]);
    mailbox_close(&mb);

    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.records, 1);
    assert_int_equal(st.files_written, 1);
    assert_int_equal(mailbox_open(f.conf, "user.bob", NULL, &mb), STORE_OK);
    tj_check_file(mb, uids[0], &m[0]);
    mailbox_message_path(mb, uids[2], &path);
    assert_int_equal(stat(buf_cstring(&path), &sb), -1);
    buf_free(&path);
    free(jpath);
    for (i = 0; i < 3; i++)
        buf_free(&m[i]);
    mailbox_close(&mb);
    tj_teardown(&f);
}

#define TJ_LOST 12

static void test_lost(void **state)
{
    struct tj_fix f;
    struct mailbox *mb[2];
    struct buf m[TJ_LOST], idx = BUF_INITIALIZER, saved = BUF_INITIALIZER;
    struct mailbox_record before[TJ_LOST][2], after;
    struct journal_replay_stats st;
    const char *kw[] = { "Important", "$Junk" };
    uint32_t uids[TJ_LOST][2];
    char *idxpath[2];
    int i, k;

    (void)state;
    tj_setup(&f, "jlost", NULL);
    mb[0] = tj_create(&f, "user.carol");
    mb[1] = tj_create(&f, "user.dave");
    for (k = 0; k < 2; k++) {
        buf_reset(&idx);
        buf_printf(&idx, "%s/cyrus.index", mailbox_dir(mb[k]));
        idxpath[k] = buf_release(&idx);
        buf_printf(&saved, "%s.before", idxpath[k]);
        tj_copy(idxpath[k], buf_cstring(&saved));
        buf_reset(&saved);
    }
    for (i = 0; i < TJ_LOST; i++) {
        memset(&m[i], 0, sizeof(m[i]));
        tj_message(&m[i], (unsigned)i, 500 + (size_t)i * 700);
        assert_int_equal(tj_deliver(&f, mb, 2, &m[i],
                                    i % 2 ? MAILBOX_FLAG_FLAGGED : 0, kw,
                                    (size_t)(i % 3), uids[i]), STORE_OK);
        for (k = 0; k < 2; k++)
            assert_int_equal(tj_record(mb[k], uids[i][k], &before[i][k]),
                             STORE_OK);
    }
    /* every write since the checkpoint lost: files gone, indexes back */
    for (k = 0; k < 2; k++) {
        for (i = 0; i < TJ_LOST; i++)
            tj_unlink_file(mb[k], uids[i][k]);
        mailbox_close(&mb[k]);
        buf_printf(&saved, "%s.before", idxpath[k]);
        assert_int_equal(rename(buf_cstring(&saved), idxpath[k]), 0);
        buf_reset(&saved);
    }

    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.records, TJ_LOST);
    assert_int_equal(st.entries, 2 * TJ_LOST);
    assert_int_equal(st.files_written, 2 * TJ_LOST);
    assert_int_equal(st.records_added, 2 * TJ_LOST);
    assert_int_equal(st.failed, 0);

    assert_int_equal(mailbox_open(f.conf, "user.carol", NULL, &mb[0]), 0);
    assert_int_equal(mailbox_open(f.conf, "user.dave", NULL, &mb[1]), 0);
    for (k = 0; k < 2; k++) {
        for (i = 0; i < TJ_LOST; i++) {
            int n;

            tj_check_file(mb[k], uids[i][k], &m[i]);
            assert_int_equal(tj_record(mb[k], uids[i][k], &after), STORE_OK);
            assert_int_equal(after.uid, before[i][k].uid);
            assert_int_equal(after.size, before[i][k].size);
            assert_int_equal(after.header_size, before[i][k].header_size);
            assert_int_equal(after.internaldate, before[i][k].internaldate);
            assert_int_equal(after.flags & MAILBOX_SYSTEM_FLAGS,
                             before[i][k].flags & MAILBOX_SYSTEM_FLAGS);
            assert_memory_equal(after.digest, before[i][k].digest,
                                MAILBOX_DIGEST_LEN);
            /* keywords by name (bit numbers may differ after the loss) */
            for (n = 0; n < (i % 3); n++) {
                int num = -1;

                assert_int_equal(mailbox_user_flag(mb[k], kw[n], 0, &num),
                                 STORE_OK);
                assert_true(after.user_flags[num / 32] &
                            (1u << (num % 32)));
            }
        }
        assert_int_equal(mailbox_check(mb[k], NULL), STORE_OK);
    }
    /* idempotent */
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.records, 0);

    for (k = 0; k < 2; k++) {
        mailbox_close(&mb[k]);
        free(idxpath[k]);
    }
    for (i = 0; i < TJ_LOST; i++)
        buf_free(&m[i]);
    buf_free(&idx);
    buf_free(&saved);
    tj_teardown(&f);
}

static void test_truncated(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m[8], idx = BUF_INITIALIZER;
    struct mailbox_record rec;
    struct journal_replay_stats st;
    const char *kw[] = { "Work" };
    uint32_t uids[8];
    int i, num;

    (void)state;
    tj_setup(&f, "jtrunc", NULL);
    mb = tj_create(&f, "user.erin");
    for (i = 0; i < 8; i++) {
        memset(&m[i], 0, sizeof(m[i]));
        tj_message(&m[i], (unsigned)i + 100, 1500);
        assert_int_equal(tj_deliver(&f, &mb, 1, &m[i], MAILBOX_FLAG_DRAFT,
                                    kw, 1, &uids[i]), STORE_OK);
    }
    buf_printf(&idx, "%s/cyrus.index", mailbox_dir(mb));
    mailbox_close(&mb);
    /* the pages of records 4..7 never reached the disk; the header did */
    assert_int_equal(truncate(buf_cstring(&idx), 4096 + 4 * 128), 0);
    assert_int_equal(mailbox_open(f.conf, "user.erin", NULL, &mb), 0);
    for (i = 4; i < 8; i++)
        tj_unlink_file(mb, uids[i]);
    mailbox_close(&mb);

    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.failed, 0);
    assert_true(st.reconstructs >= 1);
    assert_int_equal(mailbox_open(f.conf, "user.erin", NULL, &mb), 0);
    for (i = 0; i < 8; i++) {
        tj_check_file(mb, uids[i], &m[i]);
        assert_int_equal(tj_record(mb, uids[i], &rec), STORE_OK);
        assert_true(rec.flags & MAILBOX_FLAG_DRAFT);
        assert_int_equal(mailbox_user_flag(mb, "Work", 0, &num), STORE_OK);
        assert_true(rec.user_flags[num / 32] & (1u << (num % 32)));
    }
    assert_int_equal(mailbox_check(mb, NULL), STORE_OK);
    mailbox_close(&mb);
    for (i = 0; i < 8; i++)
        buf_free(&m[i]);
    buf_free(&idx);
    tj_teardown(&f);
}

#define TJ_WRAP 60

static void test_wrap(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER;
    struct commit_shared_stats s;
    struct journal_replay_stats st;
    struct mailbox_record rec;
    uint32_t uids[TJ_WRAP];
    int i;

    (void)state;
    tj_setup(&f, "jwrap", NULL);
    mb = tj_create(&f, "user.frank");
    for (i = 0; i < TJ_WRAP; i++) {
        tj_message(&m, (unsigned)i, 60000);
        assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uids[i]),
                         STORE_OK);
    }
    journal_checkpoints_wait();
    tj_shared(&f, &s);
    assert_int_equal(s.journal_records, TJ_WRAP);
    /* 60 x ~60 KB through 1 MiB segments: 3.4 segments -> 3 switches,
     * each segment checkpointed before reuse */
    assert_true(s.checkpoints >= 2);
    assert_int_equal(s.syncfs_calls, 0);
    /* the last 5 lost in place: in the live segment, so replayed */
    for (i = TJ_WRAP - 5; i < TJ_WRAP; i++)
        tj_unlink_file(mb, uids[i]);
    mailbox_close(&mb);
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_true(st.records >= 5 && st.records < 34);
    assert_int_equal(st.files_written, 5);
    assert_int_equal(st.failed, 0);
    assert_int_equal(mailbox_open(f.conf, "user.frank", NULL, &mb), 0);
    for (i = 0; i < TJ_WRAP; i++) {
        tj_message(&m, (unsigned)i, 60000);
        tj_check_file(mb, uids[i], &m);
        assert_int_equal(tj_record(mb, uids[i], &rec), STORE_OK);
    }
    /* after replay the journal starts a new generation and is used */
    tj_message(&m, 999, 1000);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uids[0]),
                     STORE_OK);
    tj_shared(&f, &s);
    assert_int_equal(s.journal_records, TJ_WRAP + 1);
    mailbox_close(&mb);
    buf_free(&m);
    tj_teardown(&f);
}

#define TJ_PROCS 4
#define TJ_PER 25

static void test_procs(void **state)
{
    struct tj_fix f;
    struct mailbox *shared, *own[TJ_PROCS];
    struct commit_shared_stats s;
    struct journal_replay_stats st;
    struct mailbox_record rec;
    struct buf m = BUF_INITIALIZER, path = BUF_INITIALIZER;
    pid_t pids[TJ_PROCS];
    char name[64];
    int p, i, status;
    uint32_t u;

    (void)state;
    tj_setup(&f, "jprocs", NULL);
    shared = tj_create(&f, "user.shared");
    for (p = 0; p < TJ_PROCS; p++) {
        snprintf(name, sizeof(name), "user.own%d", p);
        own[p] = tj_create(&f, name);
        mailbox_close(&own[p]);
    }
    mailbox_close(&shared);
    /* the journal made as at the master's start (else the deliveries
     * racing the first one's creation commit the group way) */
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    {
        /* made at the start: full size, zeros written */
        char *jpath = tj_journal_path(&f);
        struct stat sb;

        assert_int_equal(stat(jpath, &sb), 0);
        assert_int_equal(sb.st_size, 4096 + 2 * (off_t)TJ_SEG);
        assert_true(sb.st_blocks * 512 >= sb.st_size);
        free(jpath);
    }
    for (p = 0; p < TJ_PROCS; p++) {
        pids[p] = fork();
        assert_true(pids[p] >= 0);
        if (pids[p] == 0) {
            struct mailbox *mbs[2] = { NULL, NULL };
            uint32_t uids[2];

            snprintf(name, sizeof(name), "user.own%d", p);
            if (mailbox_open(f.conf, "user.shared", NULL, &mbs[0]) ||
                mailbox_open(f.conf, name, NULL, &mbs[1]))
                _exit(2);
            for (i = 0; i < TJ_PER; i++) {
                tj_message(&m, (unsigned)(p * 1000 + i), 4000);
                if (tj_deliver(&f, mbs, 2, &m, 0, NULL, 0, uids) != STORE_OK)
                    _exit(3);
            }
            mailbox_close(&mbs[0]);
            mailbox_close(&mbs[1]);
            _exit(0);
        }
    }
    for (p = 0; p < TJ_PROCS; p++) {
        assert_int_equal(waitpid(pids[p], &status, 0), pids[p]);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    tj_shared(&f, &s);
    assert_int_equal(s.journal_records, TJ_PROCS * TJ_PER);
    assert_true(s.journal_syncs >= 1 &&
                s.journal_syncs <= TJ_PROCS * TJ_PER);
    assert_int_equal(s.syncfs_calls, 0);

    /* every file lost: the replay restores all 200 copies */
    assert_int_equal(mailbox_open(f.conf, "user.shared", NULL, &shared), 0);
    for (u = 1; u <= TJ_PROCS * TJ_PER; u++)
        tj_unlink_file(shared, u);
    for (p = 0; p < TJ_PROCS; p++) {
        snprintf(name, sizeof(name), "user.own%d", p);
        assert_int_equal(mailbox_open(f.conf, name, NULL, &own[p]), 0);
        for (u = 1; u <= TJ_PER; u++)
            tj_unlink_file(own[p], u);
        mailbox_close(&own[p]);
    }
    mailbox_close(&shared);
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.records, TJ_PROCS * TJ_PER);
    assert_int_equal(st.files_written, 2 * TJ_PROCS * TJ_PER);
    assert_int_equal(st.failed, 0);
    assert_int_equal(mailbox_open(f.conf, "user.shared", NULL, &shared), 0);
    for (u = 1; u <= TJ_PROCS * TJ_PER; u++) {
        assert_int_equal(tj_record(shared, u, &rec), STORE_OK);
        mailbox_message_path(shared, u, &path);
        assert_int_equal(access(buf_cstring(&path), F_OK), 0);
        buf_reset(&path);
    }
    assert_int_equal(mailbox_check(shared, NULL), STORE_OK);
    mailbox_close(&shared);
    buf_free(&m);
    buf_free(&path);
    tj_teardown(&f);
}

static void test_failure(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER, shm = BUF_INITIALIZER;
    struct commit_shared_stats s0, s1;
    struct journal_replay_stats st;
    struct mailbox_record rec;
    uint32_t uid;

    (void)state;
    tj_setup(&f, "jfail", NULL);
    mb = tj_create(&f, "user.gina");
    tj_message(&m, 1, 1000);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uid), STORE_OK);

    /* a failed round: 4xx, the reservation cancelled */
    journal_test_fail_sync(EIO);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uid),
                     STORE_IOERROR);
    assert_int_equal(uid, 2);
    assert_int_not_equal(tj_record(mb, 2, &rec) == STORE_OK &&
                         !(rec.flags & MAILBOX_FLAG_ABORTED), 1);
    /* given up: the next delivery is synced the group way */
    tj_shared(&f, &s0);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uid), STORE_OK);
    tj_shared(&f, &s1);
    assert_int_equal(s1.journal_records, s0.journal_records);
    assert_true(s1.syncfs_calls > s0.syncfs_calls);

    /* a replay resets it: the journal is used again */
    mailbox_close(&mb);
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(mailbox_open(f.conf, "user.gina", NULL, &mb), 0);
    tj_shared(&f, &s0);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uid), STORE_OK);
    tj_shared(&f, &s1);
    assert_int_equal(s1.journal_records, s0.journal_records + 1);

    /* a new boot's shared state (another configdirectory: a fresh
     * commit.shm over the same partition) with a record beyond the
     * checkpoint: the journal waits for replay */
    mailbox_close(&mb);
    {
        struct tj_fix g;
        struct commit_shared_stats a, b;

        g.dir = th_mkdtemp("jboot");
        g.spool = strdup(f.spool);
        buf_printf(&shm, "%spartition-default: %s\n", TJ_CONF, f.spool);
        g.conf = th_store_conf(g.dir, TJ_BACKEND, buf_cstring(&shm));
        assert_int_equal(mailbox_open(g.conf, "user.gina", NULL, &mb), 0);
        assert_int_equal(tj_deliver(&g, &mb, 1, &m, 0, NULL, 0, &uid),
                         STORE_OK);
        tj_shared(&g, &a);
        assert_int_equal(a.journal_records, 0);
        assert_true(a.syncfs_calls >= 1);
        mailbox_close(&mb);
        assert_int_equal(journal_replay(g.conf, NULL, &st), STORE_OK);
        assert_int_equal(mailbox_open(g.conf, "user.gina", NULL, &mb), 0);
        assert_int_equal(tj_deliver(&g, &mb, 1, &m, 0, NULL, 0, &uid),
                         STORE_OK);
        tj_shared(&g, &b);
        assert_int_equal(b.journal_records, 1);
        mailbox_close(&mb);
        tj_teardown(&g);
    }
    buf_free(&m);
    buf_free(&shm);
    tj_teardown(&f);
}

static void test_expunged(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct mailbox_record rec;
    struct journal_replay_stats st;
    uint32_t uid, recno;

    (void)state;
    tj_setup(&f, "jexp", NULL);
    mb = tj_create(&f, "user.hank");
    tj_message(&m, 7, 1000);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uid), STORE_OK);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, NULL), STORE_OK);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_find_uid(mb, uid, &recno), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
    rec.flags |= MAILBOX_FLAG_EXPUNGED;
    assert_int_equal(mailbox_rewrite_record(mb, recno, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_cleanup(mb), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    mailbox_close(&mb);

    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.records, 2);
    assert_int_equal(st.files_written, 0);
    assert_int_equal(st.records_added, 0);
    assert_int_equal(mailbox_open(f.conf, "user.hank", NULL, &mb), 0);
    assert_int_equal(tj_record(mb, uid, &rec), STORE_NOTFOUND);
    mailbox_message_path(mb, uid, &path);
    assert_int_equal(access(buf_cstring(&path), F_OK), -1);
    mailbox_close(&mb);
    buf_free(&m);
    buf_free(&path);
    tj_teardown(&f);
}

/* A flag change runs no commit round at all (spool_sync_flags off, the
 * default: mailbox.c, FLAG CHANGES); an expunge in journal mode syncs its
 * own index (fsync), not the whole file system: a syncfs() would write
 * back every spool file the journal leaves to writeback. */
static void test_flag_commit(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER;
    struct mailbox_record rec;
    struct commit_shared_stats s0, s1;
    uint32_t uid, recno;

    (void)state;
    tj_setup(&f, "jflag", NULL);
    mb = tj_create(&f, "user.ivy");
    tj_message(&m, 3, 1000);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uid), STORE_OK);
    tj_shared(&f, &s0);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_find_uid(mb, uid, &recno), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
    rec.flags |= MAILBOX_FLAG_SEEN;
    assert_int_equal(mailbox_rewrite_record(mb, recno, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    tj_shared(&f, &s1);
    assert_int_equal(s1.commits, s0.commits);
    assert_int_equal(s1.file_syncs, s0.file_syncs);
    assert_true(mailbox_unsynced(mb));

    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
    rec.flags |= MAILBOX_FLAG_EXPUNGED;
    assert_int_equal(mailbox_rewrite_record(mb, recno, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    tj_shared(&f, &s0);
    assert_int_equal(s0.syncfs_calls, s1.syncfs_calls);
    assert_true(s0.file_syncs > s1.file_syncs);
    assert_false(mailbox_unsynced(mb));
    mailbox_close(&mb);
    buf_free(&m);
    tj_teardown(&f);
}

/* A lost finish: the header that made a message visible reached the disk,
 * the rewrite of its record (PENDING cleared) did not.  In journal mode
 * the finish never claims the index synced, so recovery repairs it. */
static void test_lost_finish(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER, idx = BUF_INITIALIZER;
    struct mailbox_record rec;
    unsigned char r0[128];
    uint32_t flags;
    int fd;

    (void)state;
    tj_setup(&f, "jfin", NULL);
    mb = tj_create(&f, "user.ivy");
    tj_message(&m, 3, 800);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, NULL), STORE_OK);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, NULL), STORE_OK);
    buf_printf(&idx, "%s/cyrus.index", mailbox_dir(mb));
    mailbox_close(&mb);
    fd = open(buf_cstring(&idx), O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pread(fd, r0, 128, 4096), 128);
    flags = le32(r0 + 4) | MAILBOX_FLAG_PENDING;
    r0[4] = (unsigned char)flags;
    r0[5] = (unsigned char)(flags >> 8);
    r0[6] = (unsigned char)(flags >> 16);
    r0[7] = (unsigned char)(flags >> 24);
    {
        uint32_t c = crc32c(r0, 124);

        r0[124] = (unsigned char)c;
        r0[125] = (unsigned char)(c >> 8);
        r0[126] = (unsigned char)(c >> 16);
        r0[127] = (unsigned char)(c >> 24);
    }
    assert_int_equal(pwrite(fd, r0, 128, 4096), 128);
    close(fd);
    assert_int_equal(mailbox_open(f.conf, "user.ivy", NULL, &mb), 0);
    assert_int_equal(tj_record(mb, 1, &rec), STORE_OK);
    assert_int_equal(mailbox_check(mb, NULL), STORE_OK);
    mailbox_close(&mb);
    buf_free(&m);
    buf_free(&idx);
    tj_teardown(&f);
}

/* After the loss took uidnext, a delivery made before the replay (the
 * group way) got the journaled message's uid: replay keeps that one and
 * brings the acknowledged message back under a new uid. */
static void test_uid_reused(void **state)
{
    struct tj_fix f, g;
    struct mailbox *mb;
    struct buf a = BUF_INITIALIZER, b = BUF_INITIALIZER,
               idx = BUF_INITIALIZER, saved = BUF_INITIALIZER;
    struct journal_replay_stats st;
    struct mailbox_record rec;
    uint32_t ua, ub;

    (void)state;
    tj_setup(&f, "jreuse", NULL);
    mb = tj_create(&f, "user.jack");
    buf_printf(&idx, "%s/cyrus.index", mailbox_dir(mb));
    buf_printf(&saved, "%s.before", buf_cstring(&idx));
    tj_copy(buf_cstring(&idx), buf_cstring(&saved));
    tj_message(&a, 1, 900);
    tj_message(&b, 2, 1300);
    assert_int_equal(tj_deliver(&f, &mb, 1, &a, 0, NULL, 0, &ua), STORE_OK);
    tj_unlink_file(mb, ua);
    mailbox_close(&mb);
    assert_int_equal(rename(buf_cstring(&saved), buf_cstring(&idx)), 0);

    g.dir = th_mkdtemp("jreuse-g");
    g.spool = strdup(f.spool);
    buf_reset(&saved);
    buf_printf(&saved, "partition-default: %s\nspool_sync: group\n", f.spool);
    g.conf = th_store_conf(g.dir, TJ_BACKEND, buf_cstring(&saved));
    assert_int_equal(mailbox_open(g.conf, "user.jack", NULL, &mb), 0);
    assert_int_equal(tj_deliver(&g, &mb, 1, &b, 0, NULL, 0, &ub), STORE_OK);
    assert_int_equal(ub, ua);
    mailbox_close(&mb);

    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.records_added, 1);
    assert_int_equal(st.failed, 0);
    assert_int_equal(mailbox_open(f.conf, "user.jack", NULL, &mb), 0);
    tj_check_file(mb, ub, &b);
    assert_int_equal(tj_record(mb, ub + 1, &rec), STORE_OK);
    tj_check_file(mb, ub + 1, &a);
    assert_int_equal(mailbox_check(mb, NULL), STORE_OK);
    mailbox_close(&mb);
    tj_teardown(&g);
    buf_free(&a);
    buf_free(&b);
    buf_free(&idx);
    buf_free(&saved);
    tj_teardown(&f);
}

/* Set the 32-bit field at `off` of the current header slot of the
 * index at path (CRCs made good again): a header write that reached the
 * disk while other writes did not. */
static void tj_header_set(const char *path, size_t off, uint32_t v)
{
    unsigned char area[4096], *p;
    int fd = open(path, O_RDWR);

    assert_true(fd >= 0);
    assert_int_equal(fs_pread_all(fd, area, sizeof(area), 0), 0);
    p = le64(area + 12) >= le64(area + 2048 + 12) &&
        le32(area + 76) == crc32c(area, 76) ? area : area + 2048;
    assert_int_equal(le32(p + 76), crc32c(p, 76));
    p[off] = (unsigned char)v;
    p[off + 1] = (unsigned char)(v >> 8);
    p[off + 2] = (unsigned char)(v >> 16);
    p[off + 3] = (unsigned char)(v >> 24);
    v = crc32c(p, 76);
    memcpy(p + 76, (unsigned char[4]){ (unsigned char)v,
           (unsigned char)(v >> 8), (unsigned char)(v >> 16),
           (unsigned char)(v >> 24) }, 4);
    v = crc32c(p, 88);
    memcpy(p + 88, (unsigned char[4]){ (unsigned char)v,
           (unsigned char)(v >> 8), (unsigned char)(v >> 16),
           (unsigned char)(v >> 24) }, 4);
    assert_int_equal(fs_pwrite_all(fd, area, sizeof(area), 0), 0);
    close(fd);
}

/* Record recno of the index at path: zeros (its sector never written). */
static void tj_zero_record(const char *path, uint32_t recno)
{
    unsigned char z[128];
    int fd = open(path, O_RDWR);

    memset(z, 0, sizeof(z));
    assert_true(fd >= 0);
    assert_int_equal(fs_pwrite_all(fd, z, sizeof(z),
                                   4096 + (off_t)recno * 128), 0);
    close(fd);
}

/* The file of uid in mb: its first `keep` bytes of m (a torn write). */
static void tj_tear_file(struct mailbox *mb, uint32_t uid,
                         const struct buf *m, size_t keep)
{
    struct buf path = BUF_INITIALIZER;
    int fd;

    mailbox_message_path(mb, uid, &path);
    unlink(buf_cstring(&path));     /* not through a shared inode */
    fd = open(buf_cstring(&path), O_WRONLY | O_CREAT | O_TRUNC, 0600);
    assert_true(fd >= 0);
    assert_int_equal(fs_write_all(fd, m->s, keep), 0);
    close(fd);
    buf_free(&path);
}

static int tj_file_exists(struct mailbox *mb, uint32_t uid)
{
    struct buf path = BUF_INITIALIZER;
    int ok;

    mailbox_message_path(mb, uid, &path);
    ok = access(buf_cstring(&path), F_OK) == 0;
    buf_free(&path);
    return ok;
}

static void test_torn_files(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m[6], idx = BUF_INITIALIZER;
    struct mailbox_record rec;
    struct journal_replay_stats st;
    uint32_t uids[6], recno;
    int i;

    (void)state;
    tj_setup(&f, "jtornf", NULL);
    mb = tj_create(&f, "user.kim");
    for (i = 0; i < 6; i++) {
        memset(&m[i], 0, sizeof(m[i]));
        tj_message(&m[i], (unsigned)i + 200, 1200 + (size_t)i * 300);
    }
    for (i = 0; i < 4; i++)
        assert_int_equal(tj_deliver(&f, &mb, 1, &m[i], MAILBOX_FLAG_SEEN,
                                    NULL, 0, &uids[i]), STORE_OK);
    buf_printf(&idx, "%s/cyrus.index", mailbox_dir(mb));
    /* the loss: record of uids[1] a zero sector (visible: recovery
     * refuses), its file torn; uids[2]'s file empty; two deliveries
     * never acknowledged left a torn and an empty file beyond */
    tj_zero_record(buf_cstring(&idx), 1);
    tj_tear_file(mb, uids[1], &m[1], m[1].len / 2);
    tj_tear_file(mb, uids[2], &m[2], 0);
    tj_tear_file(mb, uids[3] + 1, &m[4], 700);
    tj_tear_file(mb, uids[3] + 2, &m[5], 0);
    mailbox_close(&mb);

    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.failed, 0);
    assert_true(st.reconstructs >= 1);
    assert_int_equal(mailbox_open(f.conf, "user.kim", NULL, &mb), 0);
    for (i = 0; i < 4; i++) {
        tj_check_file(mb, uids[i], &m[i]);
        assert_int_equal(tj_record(mb, uids[i], &rec), STORE_OK);
        assert_int_equal(rec.size, m[i].len);
        assert_true(rec.flags & MAILBOX_FLAG_SEEN);
    }
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_get_header(mb)->exists, 4);
    assert_int_equal(mailbox_find_uid(mb, uids[3] + 1, &recno),
                     STORE_NOTFOUND);
    assert_int_equal(mailbox_find_uid(mb, uids[3] + 2, &recno),
                     STORE_NOTFOUND);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_false(tj_file_exists(mb, uids[3] + 1));
    assert_false(tj_file_exists(mb, uids[3] + 2));
    assert_int_equal(mailbox_check(mb, NULL), STORE_OK);
    mailbox_close(&mb);
    for (i = 0; i < 6; i++)
        buf_free(&m[i]);
    buf_free(&idx);
    tj_teardown(&f);
}

static void test_tail_cut(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m[4], idx = BUF_INITIALIZER;
    struct mailbox_record rec;
    struct journal_replay_stats st;
    const char *kw[] = { "Later" };
    uint32_t uids[4];
    int i, num;

    (void)state;
    tj_setup(&f, "jtail", NULL);
    mb = tj_create(&f, "user.lou");
    for (i = 0; i < 4; i++) {
        memset(&m[i], 0, sizeof(m[i]));
        tj_message(&m[i], (unsigned)i + 300, 900 + (size_t)i * 500);
        assert_int_equal(tj_deliver(&f, &mb, 1, &m[i], MAILBOX_FLAG_FLAGGED,
                                    kw, 1, &uids[i]), STORE_OK);
    }
    buf_printf(&idx, "%s/cyrus.index", mailbox_dir(mb));
    mailbox_close(&mb);
    /* the header of the last reservation (num_records 4, uidnext past
     * it) reached the disk, its finish's header (visible 4) did not, nor
     * did the record's sector; the file is torn */
    tj_header_set(buf_cstring(&idx), 32, 3);
    tj_header_set(buf_cstring(&idx), 36, 3);
    tj_header_set(buf_cstring(&idx), 48,
                  (uint32_t)(m[0].len + m[1].len + m[2].len));
    tj_zero_record(buf_cstring(&idx), 3);
    assert_int_equal(mailbox_open(f.conf, "user.lou", NULL, &mb), 0);
    tj_tear_file(mb, uids[3], &m[3], 512);
    mailbox_close(&mb);

    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.failed, 0);
    assert_int_equal(mailbox_open(f.conf, "user.lou", NULL, &mb), 0);
    for (i = 0; i < 4; i++) {
        tj_check_file(mb, uids[i], &m[i]);
        assert_int_equal(tj_record(mb, uids[i], &rec), STORE_OK);
        assert_true(rec.flags & MAILBOX_FLAG_FLAGGED);
        assert_int_equal(mailbox_user_flag(mb, "Later", 0, &num), STORE_OK);
        assert_true(rec.user_flags[num / 32] & (1u << (num % 32)));
    }
    assert_int_equal(mailbox_check(mb, NULL), STORE_OK);
    mailbox_close(&mb);
    for (i = 0; i < 4; i++)
        buf_free(&m[i]);
    buf_free(&idx);
    tj_teardown(&f);
}

static void tj_alarm(int sig)
{
    (void)sig;
    /* the delivery waited for the dead writer's record forever */
    _exit(99);
}

static void test_dead_writer(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m1 = BUF_INITIALIZER, m2 = BUF_INITIALIZER,
               m3 = BUF_INITIALIZER, j = BUF_INITIALIZER;
    struct commit_shared_stats s0, s1;
    struct journal_replay_stats st;
    struct mailbox_record rec;
    char *jpath;
    const unsigned char *p;
    uint32_t uid1, uid3, len1, len2;
    pid_t pid;
    int status;

    (void)state;
    tj_setup(&f, "jdead", NULL);
    mb = tj_create(&f, "user.dora");
    mailbox_close(&mb);
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(mailbox_open(f.conf, "user.dora", NULL, &mb), 0);
    tj_message(&m1, 1, 3000);
    tj_message(&m2, 2, 5000);
    tj_message(&m3, 3, 7000);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m1, 0, NULL, 0, &uid1),
                     STORE_OK);

    /* a writer killed between its reservation and its pwrite */
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct mailbox *own = NULL;
        uint32_t u;

        if (mailbox_open(f.conf, "user.dora", NULL, &own) != STORE_OK)
            _exit(2);
        journal_test_die_reserved(1);
        tj_deliver(&f, &own, 1, &m2, 0, NULL, 0, &u);
        _exit(0);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);

    /* the next delivery goes through the journal, behind a filler */
    tj_shared(&f, &s0);
    signal(SIGALRM, tj_alarm);
    alarm(60);
    assert_int_equal(tj_deliver(&f, &mb, 1, &m3, 0, NULL, 0, &uid3),
                     STORE_OK);
    alarm(0);
    tj_shared(&f, &s1);
    assert_int_equal(s1.journal_records, s0.journal_records + 1);
    assert_int_equal(s1.syncfs_calls, s0.syncfs_calls);

    jpath = tj_journal_path(&f);
    tj_read_file(jpath, &j);
    p = (const unsigned char *)j.s + 8192;
    len1 = le32(p + 4);
    assert_int_equal(le64(p + 16), 1);
    p += len1;
    /* the filler: magic, sequence 2, no entries, no message, a CRC */
    assert_int_equal(le32(p), 0x524a4443u);
    assert_int_equal(le64(p + 16), 2);
    assert_int_equal(le32(p + 24), 0);
    assert_int_equal(le32(p + 28), 0);
    len2 = le32(p + 4);
    assert_true(len2 > m2.len);
    {
        unsigned char *c = malloc(len2);

        assert_non_null(c);
        memcpy(c, p, len2);
        memset(c + 32, 0, 4);
        assert_int_equal(crc32c(c, len2), le32(p + 32));
        free(c);
    }
    p += len2;
    assert_int_equal(le32(p), 0x524a4443u);
    assert_int_equal(le64(p + 16), 3);
    assert_int_equal(le32(p + 28), m3.len);

    /* both acknowledged messages lost from the spool: replay reads past
     * the filler and restores them */
    tj_unlink_file(mb, uid1);
    tj_unlink_file(mb, uid3);
    mailbox_close(&mb);
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.records, 3);
    assert_int_equal(st.failed, 0);
    assert_int_equal(mailbox_open(f.conf, "user.dora", NULL, &mb), 0);
    assert_int_equal(tj_record(mb, uid1, &rec), STORE_OK);
    tj_check_file(mb, uid1, &m1);
    assert_int_equal(tj_record(mb, uid3, &rec), STORE_OK);
    tj_check_file(mb, uid3, &m3);
    assert_int_equal(mailbox_check(mb, NULL), STORE_OK);
    mailbox_close(&mb);
    free(jpath);
    buf_free(&m1);
    buf_free(&m2);
    buf_free(&m3);
    buf_free(&j);
    tj_teardown(&f);
}

/* `synced` of mb's cyrus.index (the current header slot). */
static uint32_t tj_synced(struct mailbox *mb)
{
    struct buf path = BUF_INITIALIZER, idx = BUF_INITIALIZER;
    const unsigned char *a, *b, *cur;
    char *slash;
    uint32_t v;

    mailbox_message_path(mb, 1, &path);
    slash = strrchr(path.s, '/');
    assert_non_null(slash);
    buf_truncate(&path, (size_t)(slash - path.s));
    buf_appendcstr(&path, "/cyrus.index");
    tj_read_file(buf_cstring(&path), &idx);
    assert_true(idx.len >= 4096);
    a = (const unsigned char *)idx.s;
    b = a + 2048;
    if (memcmp(b, "CDMBIDX1", 8) != 0 || crc32c(b, 76) != le32(b + 76))
        cur = a;
    else if (memcmp(a, "CDMBIDX1", 8) != 0 || crc32c(a, 76) != le32(a + 76))
        cur = b;
    else
        cur = le64(a + 12) > le64(b + 12) ? a : b;
    assert_int_equal(crc32c(cur, 76), le32(cur + 76));
    v = le32(cur + 72);
    buf_free(&path);
    buf_free(&idx);
    return v;
}

static void test_synced(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m = BUF_INITIALIZER;
    struct commit_shared_stats s0, s1;
    struct journal_replay_stats st;
    uint32_t uid, synced, max_gap = 0;
    unsigned i;

    (void)state;
    tj_setup(&f, "jsynced", NULL);
    mb = tj_create(&f, "user.sam");
    mailbox_close(&mb);
    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(mailbox_open(f.conf, "user.sam", NULL, &mb), 0);
    tj_shared(&f, &s0);
    for (i = 1; i <= 300; i++) {
        tj_message(&m, i, 600);
        assert_int_equal(tj_deliver(&f, &mb, 1, &m, 0, NULL, 0, &uid),
                         STORE_OK);
        assert_int_equal(uid, i);
        synced = tj_synced(mb);
        assert_true(synced <= i);
        if (i - synced > max_gap)
            max_gap = i - synced;
    }
    tj_shared(&f, &s1);
    assert_int_equal(s1.journal_records, s0.journal_records + 300);
    assert_int_equal(s1.syncfs_calls, s0.syncfs_calls);
    assert_true(max_gap <= 128);
    assert_true(tj_synced(mb) >= 300 - 128);
    assert_int_equal(mailbox_check(mb, NULL), STORE_OK);
    mailbox_close(&mb);
    buf_free(&m);
    tj_teardown(&f);
}

static void test_placeholder(void **state)
{
    struct tj_fix f;
    struct mailbox *mb;
    struct buf m[4], idx = BUF_INITIALIZER;
    struct mailbox_record rec;
    struct journal_replay_stats st;
    uint32_t uids[4];
    int i;

    (void)state;
    tj_setup(&f, "jplace", NULL);
    mb = tj_create(&f, "user.max");
    for (i = 0; i < 4; i++) {
        memset(&m[i], 0, sizeof(m[i]));
        tj_message(&m[i], (unsigned)i + 400, 800 + (size_t)i * 400);
        assert_int_equal(tj_deliver(&f, &mb, 1, &m[i], MAILBOX_FLAG_ANSWERED,
                                    NULL, 0, &uids[i]), STORE_OK);
    }
    buf_printf(&idx, "%s/cyrus.index", mailbox_dir(mb));
    mailbox_close(&mb);
    /* the header of the second finish reached the disk, none after it;
     * the third record's sector did not, the fourth's did */
    tj_header_set(buf_cstring(&idx), 32, 2);
    tj_header_set(buf_cstring(&idx), 36, 2);
    tj_header_set(buf_cstring(&idx), 48, (uint32_t)(m[0].len + m[1].len));
    tj_zero_record(buf_cstring(&idx), 2);

    assert_int_equal(journal_replay(f.conf, NULL, &st), STORE_OK);
    assert_int_equal(st.failed, 0);
    assert_int_equal(st.records_added, 0);
    assert_int_equal(mailbox_open(f.conf, "user.max", NULL, &mb), 0);
    for (i = 0; i < 4; i++) {
        tj_check_file(mb, uids[i], &m[i]);
        assert_int_equal(tj_record(mb, uids[i], &rec), STORE_OK);
        assert_int_equal(rec.size, m[i].len);
        assert_true(rec.flags & MAILBOX_FLAG_ANSWERED);
    }
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    assert_int_equal(mailbox_get_header(mb)->exists, 4);
    assert_int_equal(mailbox_get_header(mb)->uidnext, uids[3] + 1);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    assert_int_equal(mailbox_check(mb, NULL), STORE_OK);
    mailbox_close(&mb);
    for (i = 0; i < 4; i++)
        buf_free(&m[i]);
    buf_free(&idx);
    tj_teardown(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format),
        cmocka_unit_test(test_torn),
        cmocka_unit_test(test_lost),
        cmocka_unit_test(test_truncated),
        cmocka_unit_test(test_wrap),
        cmocka_unit_test(test_procs),
        cmocka_unit_test(test_failure),
        cmocka_unit_test(test_flag_commit),
        cmocka_unit_test(test_expunged),
        cmocka_unit_test(test_lost_finish),
        cmocka_unit_test(test_uid_reused),
        cmocka_unit_test(test_torn_files),
        cmocka_unit_test(test_tail_cut),
        cmocka_unit_test(test_placeholder),
        cmocka_unit_test(test_dead_writer),
        cmocka_unit_test(test_synced),
        cmocka_unit_test(test_readback),
        cmocka_unit_test(test_background_checkpoint),
        cmocka_unit_test(test_version),
    };

    return cmocka_run_group_tests_name("journal", tests, NULL, NULL);
}
