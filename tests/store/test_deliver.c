/*
 * test_deliver.c - one message to many mailboxes through store/deliver.c:
 * unknown recipients, repeated recipients, duplicate suppression (and its
 * switch), quota refusal per recipient, a recipient's own stage in the
 * same commit round, exactly once across a worker killed at each point of
 * a delivery (deliver_test_die_at(): the retry finds the record and the
 * copy it names), and the Message-ID parser.
 * The store cases run once per cyrusdb backend.
 */
#include "config.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <cmocka.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/append.h"
#include "store/commit.h"
#include "store/deliver.h"
#include "store/duplicate.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/quota.h"
#include "store/store.h"
#include "tests/testhelp.h"

static const char test_msg[] =
    "From: a@example.org\r\n"
    "Subject: test\r\n"
    "Message-ID: <1@example.org>\r\n"
    "\r\n"
    "body line\r\n";

static struct append_stage *test_stage(const struct imapconf *conf,
                                       const char *text)
{
    struct append_stage *st = NULL;

    assert_int_equal(append_stage_open(conf, NULL, &st), STORE_OK);
    assert_int_equal(append_stage_write(st, text, strlen(text)), STORE_OK);
    assert_int_equal(append_stage_close(st), STORE_OK);
    return st;
}

/* exists of a mailbox, read under a shared lock */
static uint32_t test_exists(const struct imapconf *conf, const char *name)
{
    struct mailbox *mb = NULL;
    uint32_t n;

    assert_int_equal(mailbox_open(conf, name, NULL, &mb), STORE_OK);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_SHARED), STORE_OK);
    n = mailbox_get_header(mb)->exists;
    mailbox_unlock(mb);
    mailbox_close(&mb);
    return n;
}

struct fixture {
    char *dir;
    struct imapconf *conf;
    struct deliver_ctx *ctx;
};

static void fixture_up(struct fixture *f, const char *backend, const char *extra)
{
    struct mboxlist *ml = NULL;

    f->dir = th_mkdtemp("deliver");
    f->conf = th_store_conf(f->dir, backend, extra);
    assert_int_equal(mboxlist_open(f->conf, &ml), STORE_OK);
    assert_int_equal(mboxlist_create(ml, TH_D "user.alice", NULL, NULL, NULL), STORE_OK);
    assert_int_equal(mboxlist_create(ml, TH_D "user.bob", NULL, NULL, NULL), STORE_OK);
    mboxlist_close(&ml);
    assert_int_equal(deliver_ctx_new(f->conf, &f->ctx), STORE_OK);
}

static void fixture_down(struct fixture *f)
{
    deliver_ctx_free(&f->ctx);
    imapconf_free(&f->conf);
    th_rmrf(f->dir);
    free(f->dir);
}

static void test_rcpts(void **state)
{
    struct fixture f;
    struct append_stage *st;
    struct deliver_rcpt r[4] = {
        { .mailbox = TH_D "user.alice" }, { .mailbox = TH_D "user.nobody" },
        { .mailbox = TH_D "user.bob" }, { .mailbox = TH_D "user.alice" },
    };

    fixture_up(&f, *state, NULL);
    st = test_stage(f.conf, test_msg);
    assert_int_equal(deliver_message(f.ctx, st, "<1@example.org>", 15, r, 4, 0),
                     STORE_OK);
    assert_int_equal(r[0].result, STORE_OK);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(r[0].uid, 1);
    assert_int_equal(r[1].result, STORE_NOTFOUND);
    assert_int_equal(r[2].result, STORE_OK);
    assert_int_equal(r[2].uid, 1);
    /* the repeated recipient shares the first one's outcome, stored once */
    assert_int_equal(r[3].result, STORE_OK);
    assert_int_equal(r[3].uid, 1);
    append_stage_free(&st);
    assert_int_equal(test_exists(f.conf, TH_D "user.alice"), 1);
    assert_int_equal(test_exists(f.conf, TH_D "user.bob"), 1);
    fixture_down(&f);
}

static void test_duplicates(void **state)
{
    struct fixture f;
    struct append_stage *st;
    struct deliver_rcpt r[2] = { { .mailbox = TH_D "user.alice" },
                                 { .mailbox = TH_D "user.bob" } };
    int i;

    fixture_up(&f, *state, NULL);
    for (i = 0; i < 3; i++) {
        st = test_stage(f.conf, test_msg);
        /* the second and third time only bob is new the second time */
        assert_int_equal(deliver_message(f.ctx, st, "<1@example.org>", 15, r,
                                         i == 0 ? 1 : 2, 0), STORE_OK);
        append_stage_free(&st);
        assert_int_equal(r[0].result, STORE_OK);
        assert_int_equal(r[0].duplicate, i > 0);
        if (i == 1) {
            assert_int_equal(r[1].result, STORE_OK);
            assert_int_equal(r[1].duplicate, 0);
        }
        if (i == 2)
            assert_int_equal(r[1].duplicate, 1);
    }
    assert_int_equal(test_exists(f.conf, TH_D "user.alice"), 1);
    assert_int_equal(test_exists(f.conf, TH_D "user.bob"), 1);
    /* another Message-ID is delivered; DELIVER_NO_DUPCHECK stores again */
    st = test_stage(f.conf, test_msg);
    assert_int_equal(deliver_message(f.ctx, st, "<2@example.org>", 15, r, 1, 0),
                     STORE_OK);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(deliver_message(f.ctx, st, "<1@example.org>", 15, r, 1,
                                     DELIVER_NO_DUPCHECK), STORE_OK);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(r[0].result, STORE_OK);
    append_stage_free(&st);
    assert_int_equal(test_exists(f.conf, TH_D "user.alice"), 3);
    fixture_down(&f);
}

static void test_suppression_off(void **state)
{
    struct fixture f;
    struct append_stage *st;
    struct deliver_rcpt r[1] = { { .mailbox = TH_D "user.alice" } };
    int i;

    fixture_up(&f, *state, "duplicatesuppression: no\n");
    for (i = 0; i < 2; i++) {
        st = test_stage(f.conf, test_msg);
        assert_int_equal(deliver_message(f.ctx, st, "<1@example.org>", 15, r,
                                         1, 0), STORE_OK);
        assert_int_equal(r[0].result, STORE_OK);
        assert_int_equal(r[0].duplicate, 0);
        append_stage_free(&st);
    }
    assert_int_equal(test_exists(f.conf, TH_D "user.alice"), 2);
    fixture_down(&f);
}

static void test_quota(void **state)
{
    struct fixture f;
    struct quota_db *q = NULL;
    struct append_stage *st;
    struct deliver_rcpt r[2] = { { .mailbox = TH_D "user.alice" },
                                 { .mailbox = TH_D "user.bob" } };

    fixture_up(&f, *state, NULL);
    assert_int_equal(quota_open(f.conf, &q), STORE_OK);
    assert_int_equal(quota_set(q, TH_D "user.alice", QUOTA_UNLIMITED, 1), STORE_OK);
    quota_close(&q);
    st = test_stage(f.conf, test_msg);
    assert_int_equal(deliver_message(f.ctx, st, NULL, 0, r, 2, 0), STORE_OK);
    assert_int_equal(r[0].result, STORE_OK);
    assert_int_equal(deliver_message(f.ctx, st, NULL, 0, r, 2, 0), STORE_OK);
    /* alice is full (1 message), bob still gets it */
    assert_int_equal(r[0].result, STORE_OVERQUOTA);
    assert_int_equal(r[1].result, STORE_OK);
    assert_int_equal(deliver_message(f.ctx, st, NULL, 0, r, 1,
                                     DELIVER_IGNORE_QUOTA), STORE_OK);
    assert_int_equal(r[0].result, STORE_OK);
    append_stage_free(&st);
    assert_int_equal(test_exists(f.conf, TH_D "user.alice"), 2);
    assert_int_equal(test_exists(f.conf, TH_D "user.bob"), 2);
    fixture_down(&f);
}

/* The first bytes of message uid in mailbox name into out. */
static void test_read_message(const struct imapconf *conf, const char *name,
                              uint32_t uid, char *out, size_t len)
{
    struct mailbox *mb = NULL;
    struct buf path = BUF_INITIALIZER;
    FILE *fp;
    size_t n;

    assert_int_equal(mailbox_open(conf, name, NULL, &mb), STORE_OK);
    mailbox_message_path(mb, uid, &path);
    fp = fopen(buf_cstring(&path), "rb");
    assert_non_null(fp);
    n = fread(out, 1, len - 1, fp);
    out[n] = '\0';
    fclose(fp);
    buf_free(&path);
    mailbox_close(&mb);
}

/* A recipient with a stage of its own (lmtpd's editheader) gets that
 * message, the others the message's, in one commit round. */
static void test_own_stage(void **state)
{
    static const char edited[] =
        "X-Edited: yes\r\n"
        "From: a@example.org\r\n"
        "Subject: test\r\n"
        "Message-ID: <1@example.org>\r\n"
        "\r\n"
        "body line\r\n";
    struct fixture f;
    struct append_stage *st, *own;
    struct commit_stats c0, c1;
    struct deliver_rcpt r[2] = { { .mailbox = TH_D "user.alice" },
                                 { .mailbox = TH_D "user.bob" } };
    char got[256];

    fixture_up(&f, *state, NULL);
    st = test_stage(f.conf, test_msg);
    own = test_stage(f.conf, edited);
    r[0].stage = own;
    commit_stats_get(&c0);
    assert_int_equal(deliver_message(f.ctx, st, "<1@example.org>", 15, r, 2,
                                     0), STORE_OK);
    commit_stats_get(&c1);
    assert_int_equal(r[0].result, STORE_OK);
    assert_int_equal(r[1].result, STORE_OK);
    assert_int_equal(c1.rounds - c0.rounds, 1);
    append_stage_free(&st);
    append_stage_free(&own);
    test_read_message(f.conf, TH_D "user.alice", r[0].uid, got, sizeof(got));
    assert_string_equal(got, edited);
    test_read_message(f.conf, TH_D "user.bob", r[1].uid, got, sizeof(got));
    assert_string_equal(got, test_msg);
    fixture_down(&f);
}

/* ---- exactly once across a killed worker ---- */

#define TEST_ID "<1@example.org>"
#define TEST_JOURNAL "spool_sync: journal\njournal_size: 1048576\n"

/* In a child process with a context of its own, deliver test_msg to alice
 * and bob with the fault point `point` armed; the child must die there
 * (SIGKILL), as an lmtpd worker killed before its 250. */
static void test_killed_delivery(const struct imapconf *conf, int point)
{
    pid_t pid;
    int status;

    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct deliver_ctx *ctx = NULL;
        struct append_stage *st = NULL;
        struct deliver_rcpt r[2] = { { .mailbox = TH_D "user.alice" },
                                     { .mailbox = TH_D "user.bob" } };

        if (deliver_ctx_new(conf, &ctx) != STORE_OK ||
            append_stage_open(conf, NULL, &st) != STORE_OK ||
            append_stage_write(st, test_msg, strlen(test_msg)) != STORE_OK ||
            append_stage_close(st) != STORE_OK)
            _exit(3);
        deliver_test_die_at(point);
        deliver_message(ctx, st, TEST_ID, strlen(TEST_ID), r, 2, 0);
        _exit(2);               /* not reached: the point was passed */
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    assert_int_equal(WTERMSIG(status), SIGKILL);
}

/* The sender's retry, in a new context (a new worker): each recipient's
 * duplicate flag is checked against want_dup. */
static void test_retry(struct fixture *f, int want_dup)
{
    struct append_stage *st;
    struct deliver_rcpt r[2] = { { .mailbox = TH_D "user.alice" },
                                 { .mailbox = TH_D "user.bob" } };

    assert_int_equal(deliver_ctx_new(f->conf, &f->ctx), STORE_OK);
    st = test_stage(f->conf, test_msg);
    assert_int_equal(deliver_message(f->ctx, st, TEST_ID, strlen(TEST_ID), r,
                                     2, 0), STORE_OK);
    append_stage_free(&st);
    assert_int_equal(r[0].result, STORE_OK);
    assert_int_equal(r[1].result, STORE_OK);
    assert_int_equal(r[0].duplicate, want_dup);
    assert_int_equal(r[1].duplicate, want_dup);
}

/* A worker killed at `point`, then the retry. */
static void test_kill_case(const char *backend, const char *extra, int point,
                           int want_dup)
{
    struct fixture f;

    fixture_up(&f, backend, extra);
    deliver_ctx_free(&f.ctx);   /* the child opens its own */
    test_killed_delivery(f.conf, point);
    test_retry(&f, want_dup);
    /* exactly one copy in each mailbox, never two, never none */
    assert_int_equal(test_exists(f.conf, TH_D "user.alice"), 1);
    assert_int_equal(test_exists(f.conf, TH_D "user.bob"), 1);
    fixture_down(&f);
}

/* Killed after the commit, before the 250: the retry is a duplicate. */
static void test_kill_after_commit(void **state)
{
    test_kill_case(*state, NULL, DELIVER_DIE_AFTER_COMMIT, 1);
    test_kill_case(*state, TEST_JOURNAL, DELIVER_DIE_AFTER_COMMIT, 1);
}

/* Killed with the message reserved, before the commit: recovery commits
 * the complete reservation, the retry is a duplicate. */
static void test_kill_before_commit(void **state)
{
    test_kill_case(*state, NULL, DELIVER_DIE_BEFORE_COMMIT, 1);
    test_kill_case(*state, TEST_JOURNAL, DELIVER_DIE_BEFORE_COMMIT, 1);
}

/* Killed before the commit, and alice's message file lost (as a power
 * loss takes a file never synced): recovery aborts alice's reservation, the record names no stored copy, the retry stores it
 * (bob's was kept: a duplicate there). */
static void test_kill_lost_reservation(void **state)
{
    struct fixture f;
    struct append_stage *st;
    struct deliver_rcpt r[2] = { { .mailbox = TH_D "user.alice" },
                                 { .mailbox = TH_D "user.bob" } };
    struct mailbox *mb = NULL;
    struct buf path = BUF_INITIALIZER;

    fixture_up(&f, *state, NULL);
    deliver_ctx_free(&f.ctx);
    test_killed_delivery(f.conf, DELIVER_DIE_BEFORE_COMMIT);
    assert_int_equal(mailbox_open(f.conf, TH_D "user.alice", NULL, &mb),
                     STORE_OK);
    mailbox_message_path(mb, 1, &path);
    assert_int_equal(unlink(buf_cstring(&path)), 0);
    buf_free(&path);
    mailbox_close(&mb);
    assert_int_equal(deliver_ctx_new(f.conf, &f.ctx), STORE_OK);
    st = test_stage(f.conf, test_msg);
    assert_int_equal(deliver_message(f.ctx, st, TEST_ID, strlen(TEST_ID), r,
                                     2, 0), STORE_OK);
    append_stage_free(&st);
    assert_int_equal(r[0].result, STORE_OK);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(r[0].uid, 2);
    assert_int_equal(r[1].result, STORE_OK);
    assert_int_equal(r[1].duplicate, 1);
    assert_int_equal(test_exists(f.conf, TH_D "user.alice"), 1);
    assert_int_equal(test_exists(f.conf, TH_D "user.bob"), 1);
    fixture_down(&f);
}

/* Killed after the records were written, before anything was reserved:
 * the records name nothing, the retry delivers. */
static void test_kill_after_mark(void **state)
{
    test_kill_case(*state, NULL, DELIVER_DIE_AFTER_MARK, 0);
}

/* What a record of each kind suppresses: an expunged copy still counts;
 * a named copy holding another message (a uid given again), or named at
 * a uid no message reached, does not; a record of the short form (Sieve,
 * a move, an older version) counts without a look. */
static void test_record_kinds(void **state)
{
    static const char other[] =
        "From: b@example.org\r\n"
        "Message-ID: <2@example.org>\r\n"
        "\r\n"
        "another body\r\n";
    struct fixture f;
    struct append_stage *st;
    struct deliver_rcpt r[1] = { { .mailbox = TH_D "user.alice" } };
    struct duplicate_db *d = NULL;
    struct duplicate_copy c;
    struct mailbox *mb = NULL;
    struct mailbox_record rec;
    const char *names[1] = { TH_D "user.alice" };
    uint32_t recno;

    fixture_up(&f, *state, NULL);
    /* an expunged copy: still delivered */
    st = test_stage(f.conf, test_msg);
    assert_int_equal(deliver_message(f.ctx, st, TEST_ID, strlen(TEST_ID), r,
                                     1, 0), STORE_OK);
    assert_int_equal(r[0].uid, 1);
    assert_int_equal(mailbox_open(f.conf, TH_D "user.alice", NULL, &mb),
                     STORE_OK);
    assert_int_equal(mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE), STORE_OK);
    assert_int_equal(mailbox_find_uid(mb, 1, &recno), STORE_OK);
    assert_int_equal(mailbox_read_record(mb, recno, &rec), STORE_OK);
    rec.flags |= MAILBOX_FLAG_EXPUNGED;
    assert_int_equal(mailbox_rewrite_record(mb, recno, &rec), STORE_OK);
    assert_int_equal(mailbox_unlock(mb), STORE_OK);
    mailbox_close(&mb);
    assert_int_equal(deliver_message(f.ctx, st, TEST_ID, strlen(TEST_ID), r,
                                     1, 0), STORE_OK);
    assert_int_equal(r[0].duplicate, 1);
    append_stage_free(&st);

    /* uid 2 holds another message; a record for <3@x> names uid 2 with
     * test_msg's SHA-1 ... */
    st = test_stage(f.conf, other);
    assert_int_equal(deliver_message(f.ctx, st, "<2@example.org>", 15, r, 1,
                                     0), STORE_OK);
    assert_int_equal(r[0].uid, 2);
    append_stage_free(&st);
    st = test_stage(f.conf, test_msg);
    assert_int_equal(deliver_duplicate_db(f.ctx, &d), STORE_OK);
    memset(&c, 0, sizeof(c));
    c.uid = 2;
    assert_int_equal(mailbox_open(f.conf, TH_D "user.alice", NULL, &mb),
                     STORE_OK);
    c.uidvalidity = mailbox_get_header(mb)->uidvalidity;
    mailbox_close(&mb);
    memcpy(c.guid, append_stage_info(st)->digest, DUPLICATE_GUID_LEN);
    assert_int_equal(duplicate_mark_copies(d, "<3@x>", 5, names, &c, 1,
                                           time(NULL)), STORE_OK);
    /* ... and is not believed: delivered */
    assert_int_equal(deliver_message(f.ctx, st, "<3@x>", 5, r, 1, 0),
                     STORE_OK);
    assert_int_equal(r[0].duplicate, 0);
    assert_int_equal(r[0].uid, 3);
    /* a record naming a uid at or above uidnext: delivered */
    c.uid = 100;
    assert_int_equal(duplicate_mark_copies(d, "<4@x>", 5, names, &c, 1,
                                           time(NULL)), STORE_OK);
    assert_int_equal(deliver_message(f.ctx, st, "<4@x>", 5, r, 1, 0),
                     STORE_OK);
    assert_int_equal(r[0].duplicate, 0);
    /* a short record: a duplicate, whatever the mailbox holds */
    assert_int_equal(duplicate_mark(d, "<5@x>", 5, names[0], time(NULL), 0),
                     STORE_OK);
    assert_int_equal(deliver_message(f.ctx, st, "<5@x>", 5, r, 1, 0),
                     STORE_OK);
    assert_int_equal(r[0].duplicate, 1);
    append_stage_free(&st);
    /* 1 (expunged), 2, 3, 4 */
    assert_int_equal(test_exists(f.conf, TH_D "user.alice"), 3);
    fixture_down(&f);
}

static void test_find_msgid(void **state)
{
    struct buf id = BUF_INITIALIZER;
    static const char folded[] =
        "Subject: x\r\nmessage-id:\r\n  <folded@example.org>  \r\nTo: y\r\n\r\n";
    static const char inbody[] =
        "Subject: x\r\n\r\nMessage-ID: <body@example.org>\r\n";
    static const char lf[] = "Message-Id : <lf@x>\nX: y\n\nbody\n";
    static const char empty[] = "Message-ID:   \r\n\r\n";
    static const char first[] =
        "Message-ID: <a@x>\r\nMessage-ID: <b@x>\r\n\r\n";

    (void)state;
    assert_int_equal(deliver_find_msgid(test_msg, sizeof(test_msg) - 1, &id), 1);
    assert_string_equal(buf_cstring(&id), "<1@example.org>");
    assert_int_equal(deliver_find_msgid(folded, sizeof(folded) - 1, &id), 1);
    assert_string_equal(buf_cstring(&id), "<folded@example.org>");
    assert_int_equal(deliver_find_msgid(inbody, sizeof(inbody) - 1, &id), 0);
    assert_int_equal(deliver_find_msgid(lf, sizeof(lf) - 1, &id), 1);
    assert_string_equal(buf_cstring(&id), "<lf@x>");
    assert_int_equal(deliver_find_msgid(empty, sizeof(empty) - 1, &id), 0);
    assert_int_equal(deliver_find_msgid(first, sizeof(first) - 1, &id), 1);
    assert_string_equal(buf_cstring(&id), "<a@x>");
    /* cut in the middle of the field name: not found, no overread */
    assert_int_equal(deliver_find_msgid("Message-I", 9, &id), 0);
    assert_int_equal(deliver_find_msgid("", 0, &id), 0);
    buf_free(&id);
}

int main(void)
{
    static const struct th_case cases[] = {
        { "rcpts", test_rcpts },
        { "duplicates", test_duplicates },
        { "suppression_off", test_suppression_off },
        { "quota", test_quota },
        { "own_stage", test_own_stage },
        { "kill_after_commit", test_kill_after_commit },
        { "kill_before_commit", test_kill_before_commit },
        { "kill_lost_reservation", test_kill_lost_reservation },
        { "kill_after_mark", test_kill_after_mark },
        { "record_kinds", test_record_kinds },
    };
    const struct CMUnitTest plain[] = {
        cmocka_unit_test(test_find_msgid),
    };
    int failed;

    log_init("test_deliver", LOG_TO_NONE);
    failed = cmocka_run_group_tests_name("deliver_parse", plain, NULL, NULL);
    failed += th_run_per_backend("deliver", cases, sizeof(cases) / sizeof(cases[0]));
    return failed;
}
