/*
 * test_append_crash.c - an appender SIGKILLed at many moments, every
 * backend (the backend holds the quota database).
 *
 * For each backend, ONE mailbox (with a quota root on it) lives through
 * all the kills, so that damage would accumulate:
 *
 *   writer (forked): opens the mailbox, tells the parent it is ready, then
 *   appends messages in a loop: stage (in chunks), append_begin,
 *   append_add (every 4th transaction adds the same message twice, so a
 *   commit covers two reservations), append_commit, and only after
 *   append_commit returned STORE_OK writes (uid, round, seq) of each
 *   message to a pipe: its acknowledgements.  Every message carries a
 *   marker line "MARKER r=ROUND s=SEQ" in its body, from which its exact
 *   bytes can be generated again.
 *
 *   parent (40 to 150 rounds per backend, as time allows): SIGKILLs the
 *   writer after a delay spread logarithmically from a fiftieth of F to
 *   ten times F, where F is the time from "ready" to the first
 *   acknowledgement, counted from the writer's "ready" (mostly), or from
 *   fork() over the open and two first appends, so kills land in
 *   staging, in reservations, in sync rounds and in finishes.  Nothing in
 *   the schedule is a fixed duration: timing rounds (the first three,
 *   then one in TC_CAL_EVERY) let a writer open and commit TC_CAL_APPENDS
 *   appends before the kill, and time its open and its first append; the
 *   delays scale by the medians measured, times a stretch
 *   (th_stretch_note) that grows when too few recent kills landed after a
 *   commit and shrinks when too few landed inside the first append.  At
 *   least TC_MIN_EACH of each are required (the run goes on past its
 *   budget until then), so a fast machine and a slow, loaded one test the
 *   same thing.
 *
 *   checker (forked after each kill): cyrusdb_recover() on the
 *   configuration directory (what the system start runs after a crash;
 *   a Berkeley DB environment a writer died in needs it), then the
 *   exclusive mailbox lock (recovery of the dead appender's pending
 *   records), then, under a shared lock:
 *     - mailbox_check() passes;
 *     - every visible message is complete: its file has the recorded size
 *       and digest (SHA-1 computed here), and its bytes are exactly those
 *       its marker names; no record is left PENDING;
 *     - exists and quota_used of the header equal the count and the size
 *       sum of the visible messages, and the quota root's usage equals
 *       them (quota.db kept in line with the index);
 *     - every uid the writers ever acknowledged (in this round and all
 *       earlier ones) is visible and holds the message acknowledged for
 *       it: nothing acknowledged is lost, and acknowledged <= visible.
 *   At the end, one more append (in a child) still works, and the checks
 *   hold once more.
 *
 *   Built a second time with -DTC_JOURNAL (test_append_crash_journal):
 *   everything runs with spool_sync: journal and 1 MiB segments, and the
 *   checker runs journal_replay() after cyrusdb_recover() as the start
 *   does; the kills then also land inside journal writes, fdatasync
 *   rounds (a dead leader), segment switches and checkpoints.  The parent itself opens no database and no mailbox,
 *   so it holds nothing open across the recoveries.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <setjmp.h>
#include <cmocka.h>

#include <openssl/evp.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "cyrusdb/cyrusdb.h"
#include "store/append.h"
#include "store/commit.h"
#include "store/journal.h"
#include "store/mailbox.h"
#include "store/quota.h"
#include "store/store.h"
#include "tests/testhelp.h"

/* the build with -DTC_JOURNAL runs everything with spool_sync: journal
 * (small segments, so that kills also land in switches and checkpoints) */
#ifdef TC_JOURNAL
#define TC_CONF "spool_sync: journal\njournal_size: 1048576\n"
#else
#define TC_CONF NULL
#endif
#define TC_ROUNDS 150             /* kills per backend, at most ... */
#define TC_BUDGET_S 4.0           /* ... while time is left (per backend) */
#define TC_MIN_ROUNDS 40          /* kills per backend, at least */
#define TC_ROUNDS_MAX 300         /* while the kills do not cover both sides */
#define TC_MIN_EACH 5             /* kills inside the first append / after a commit */
#define TC_CAL_ROUNDS 3           /* timing rounds first ... */
#define TC_CAL_EVERY 20           /* ... and one in this many later on */
#define TC_CAL_APPENDS 8          /* commits a timing round waits for */
#define TC_SPAN_APPENDS 10.0      /* longest delay from ready, in first appends */
#define TC_MAX_DELAY_US 20e6
#define TC_HANG_S 120.0           /* an open or append that takes longer hangs */
#define TC_CHILD_LIFE_S 600       /* a writer never killed gives up */
#define TC_CHECK_S 300            /* a check that takes longer hangs */
#define TC_MBOX "user.crash"
#define TC_MAX_ACKS 20000

struct tc_ack {
    uint32_t uid;
    uint32_t round;
    uint32_t seq;
};

/* Message (round, seq): marker line, then a body whose length varies up
 * to ~24 KiB. */
static void tc_message(struct buf *m, unsigned round, unsigned seq)
{
    unsigned n = round * 7919u + seq * 104729u, k, len;

    buf_reset(m);
    buf_printf(m, "From: crash@example.org\r\n"
               "Subject: round %u seq %u\r\n"
               "\r\n"
               "MARKER r=%u s=%u\r\n", round, seq, round, seq);
    len = n % 24000u;
    for (k = 0; k < len; k++) {
        if (k % 76 == 74)
            buf_append(m, "\r\n", 2);
        else
            buf_putc(m, '0' + (int)((n + k * 13u) % 43u));
    }
    buf_append(m, "\r\n", 2);
}

static int tc_write_all(int fd, const void *p, size_t len)
{
    const char *c = p;

    while (len) {
        ssize_t w = write(fd, c, len);

        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        c += w;
        len -= (size_t)w;
    }
    return 0;
}

static void tc_writer_fail(const char *what, int r)
{
    fprintf(stderr, "test_append_crash: writer[%ld]: %s: %s\n",
            (long)getpid(), what, store_strerror(r));
    _exit(1);
}

/* Runs until killed. */
static void tc_writer(const struct imapconf *conf, unsigned round,
                      int ackfd, int readyfd)
{
    struct mailbox *mb = NULL;
    struct buf m = BUF_INITIALIZER;
    struct append_stage *st;
    struct append_txn *t;
    struct tc_ack acks[2];
    unsigned seq, n, k;
    size_t off, chunk;
    int r;

    th_child_signals();
    alarm(TC_CHILD_LIFE_S);
    r = mailbox_open(conf, TC_MBOX, "default", &mb);
    if (r)
        tc_writer_fail("mailbox_open", r);
    if (tc_write_all(readyfd, "r", 1) != 0)
        _exit(1);
    for (seq = 0;; seq++) {
        tc_message(&m, round, seq);
        st = NULL;
        t = NULL;
        if ((r = append_stage_open(conf, NULL, &st)))
            tc_writer_fail("append_stage_open", r);
        chunk = 1000 + (seq % 7) * 900;
        for (off = 0; off < m.len; off += chunk) {
            r = append_stage_write(st, m.s + off,
                                   m.len - off < chunk ? m.len - off : chunk);
            if (r)
                tc_writer_fail("append_stage_write", r);
        }
        if ((r = append_stage_close(st)))
            tc_writer_fail("append_stage_close", r);
        if ((r = append_begin(conf, &t)))
            tc_writer_fail("append_begin", r);
        n = seq % 4 == 3 ? 2 : 1;
        for (k = 0; k < n; k++) {
            acks[k].round = round;
            acks[k].seq = seq;
            if ((r = append_add(t, mb, st, 0, 0, 0, &acks[k].uid)))
                tc_writer_fail("append_add", r);
        }
        if ((r = append_commit(t)))
            tc_writer_fail("append_commit", r);
        /* acknowledged: only now does the world learn about it */
        if (tc_write_all(ackfd, acks, n * sizeof(acks[0])) != 0)
            _exit(1);
        append_free(&t);
        append_stage_free(&st);
    }
}

/* ---- the checker (a forked child, after each kill) ------------------------ */

/* Everything here runs in a child that reports by exit status and
 * messages on stderr: cmocka's assertions must not run outside the
 * runner's process. */

struct tc_state {
    struct tc_ack *acks;    /* every acknowledgement so far */
    size_t nacks;
};

static void tc_sha1(const void *data, size_t len, unsigned char *out)
{
    unsigned int n = 0;

    EVP_Digest(data, len, out, &n, EVP_sha1(), NULL);
}

static int tc_read_message(struct mailbox *mb, uint32_t uid, struct buf *out)
{
    char chunk[16384];
    ssize_t n;
    int fd = -1;

    if (mailbox_open_message(mb, uid, &fd) != STORE_OK)
        return -1;
    buf_reset(out);
    while ((n = read(fd, chunk, sizeof(chunk))) > 0)
        if (buf_append(out, chunk, (size_t)n) != 0)
            n = -1;
    close(fd);
    return n == 0 ? 0 : -1;
}

/* "MARKER r=R s=S" after the header. */
static int tc_parse_marker(const struct buf *msg, unsigned *r_r, unsigned *s_r)
{
    const char *p = msg->s;
    size_t i, hs = msg->len;
    char tmp[64];
    size_t n;

    for (i = 0; i + 3 < msg->len; i++)
        if (p[i] == '\r' && p[i + 1] == '\n' && p[i + 2] == '\r' &&
            p[i + 3] == '\n') {
            hs = i + 4;
            break;
        }
    n = msg->len - hs < sizeof(tmp) - 1 ? msg->len - hs : sizeof(tmp) - 1;
    memcpy(tmp, p + hs, n);
    tmp[n] = '\0';
    return sscanf(tmp, "MARKER r=%u s=%u", r_r, s_r) == 2 ? 0 : -1;
}

#define TC_FAIL(...) do {                                                   \
        fprintf(stderr, "test_append_crash: round %u: ", round);            \
        fprintf(stderr, __VA_ARGS__);                                       \
        fputc('\n', stderr);                                                \
        goto out;                                                           \
    } while (0)

/* Recovery and the checks of the file comment.  0 when all hold. */
static int tc_check(const struct imapconf *conf, const struct tc_state *s,
                    unsigned round)
{
    struct mailbox *mb = NULL;
    struct quota_db *q = NULL;
    struct quota qv;
    struct mailbox_record rec;
    const struct mailbox_header *h;
    struct buf got = BUF_INITIALIZER, want = BUF_INITIALIZER;
    struct buf problem = BUF_INITIALIZER;
    unsigned char dg[MAILBOX_DIGEST_LEN];
    uint32_t recno, exists = 0, prev = 0, *round_of = NULL, *seq_of = NULL;
    uint64_t bytes = 0;
    unsigned mr, ms;
    size_t i, nuid;
    int r, rc = 1, locked = 0;

    /* what the system start does after a crash (ctl_cyrusdb -r) */
    if ((r = cyrusdb_recover(imapconf_getstring(conf, "configdirectory"))))
        TC_FAIL("cyrusdb_recover: %s", cyrusdb_strerror(r));
#ifdef TC_JOURNAL
    /* spool_sync: journal: the journal's replay comes next at the start;
     * after a killed process it must find everything in place and must
     * not disturb the mailbox's own recovery */
    {
        struct journal_replay_stats js;

        if ((r = journal_replay(conf, NULL, &js)))
            TC_FAIL("journal_replay: %s", store_strerror(r));
        if (js.failed)
            TC_FAIL("journal_replay: %lu entries failed", js.failed);
    }
#endif
    if ((r = mailbox_open(conf, TC_MBOX, "default", &mb)))
        TC_FAIL("mailbox_open: %s", store_strerror(r));
    /* recovery of the dead writer's appends */
    if ((r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE)))
        TC_FAIL("exclusive lock (recovery): %s", store_strerror(r));
    if ((r = mailbox_unlock(mb)))
        TC_FAIL("unlock after recovery: %s", store_strerror(r));

    if ((r = mailbox_lock(mb, MAILBOX_LOCK_SHARED)))
        TC_FAIL("shared lock: %s", store_strerror(r));
    locked = 1;
    if ((r = mailbox_check(mb, &problem)))
        TC_FAIL("mailbox_check: %s", buf_cstring(&problem));
    h = mailbox_get_header(mb);
    nuid = (size_t)h->uidnext + 1;
    round_of = calloc(nuid, sizeof(*round_of));
    seq_of = calloc(nuid, sizeof(*seq_of));
    if (!round_of || !seq_of)
        TC_FAIL("out of memory");

    for (recno = 0; recno < h->visible; recno++) {
        if ((r = mailbox_read_record(mb, recno, &rec)))
            TC_FAIL("record %u: %s", recno, store_strerror(r));
        if (rec.uid <= prev || rec.uid >= h->uidnext)
            TC_FAIL("record %u: uid %u out of order (previous %u, uidnext "
                    "%u)", recno, rec.uid, prev, h->uidnext);
        prev = rec.uid;
        if (rec.flags & MAILBOX_FLAG_PENDING)
            TC_FAIL("uid %u still PENDING after recovery", rec.uid);
        if (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
            continue;
        exists++;
        bytes += rec.size;
        if (tc_read_message(mb, rec.uid, &got) != 0)
            TC_FAIL("uid %u visible but its file does not read", rec.uid);
        if (got.len != rec.size)
            TC_FAIL("uid %u: file has %zu bytes, record says %u", rec.uid,
                    got.len, rec.size);
        tc_sha1(got.s, got.len, dg);
        if (memcmp(dg, rec.digest, sizeof(dg)) != 0)
            TC_FAIL("uid %u: digest mismatch (a torn message is visible)",
                    rec.uid);
        if (tc_parse_marker(&got, &mr, &ms) != 0)
            TC_FAIL("uid %u: no marker", rec.uid);
        tc_message(&want, mr, ms);
        if (want.len != got.len || memcmp(want.s, got.s, got.len) != 0)
            TC_FAIL("uid %u: bytes differ from message r=%u s=%u", rec.uid,
                    mr, ms);
        round_of[rec.uid] = mr + 1;   /* 0 = not visible */
        seq_of[rec.uid] = ms;
    }
    if (h->exists != exists)
        TC_FAIL("header exists=%u, visible messages %u", h->exists, exists);
    if (h->quota_used != bytes)
        TC_FAIL("header quota_used=%llu, messages sum to %llu",
                (unsigned long long)h->quota_used, (unsigned long long)bytes);

    /* nothing acknowledged lost, ever */
    if (s->nacks > exists)
        TC_FAIL("%zu acknowledged, only %u visible", s->nacks, exists);
    for (i = 0; i < s->nacks; i++) {
        const struct tc_ack *a = &s->acks[i];

        if (a->uid == 0 || a->uid >= nuid || round_of[a->uid] == 0)
            TC_FAIL("acknowledged uid %u (r=%u s=%u) is lost", a->uid,
                    a->round, a->seq);
        if (round_of[a->uid] != a->round + 1 || seq_of[a->uid] != a->seq)
            TC_FAIL("uid %u holds r=%u s=%u, acknowledged as r=%u s=%u",
                    a->uid, round_of[a->uid] - 1, seq_of[a->uid], a->round,
                    a->seq);
    }
    locked = 0;
    if ((r = mailbox_unlock(mb)))
        TC_FAIL("unlock: %s", store_strerror(r));

    /* quota.db in line with the index */
    if ((r = quota_open(conf, &q)))
        TC_FAIL("quota_open: %s", store_strerror(r));
    if ((r = quota_get(q, TC_MBOX, &qv)))
        TC_FAIL("quota_get: %s", store_strerror(r));
    if (qv.used_bytes != bytes || qv.used_messages != exists)
        TC_FAIL("quota root says %llu bytes / %llu messages, mailbox has "
                "%llu / %u", (unsigned long long)qv.used_bytes,
                (unsigned long long)qv.used_messages,
                (unsigned long long)bytes, exists);
    rc = 0;
out:
    if (q)
        quota_close(&q);
    if (locked)
        mailbox_unlock(mb);
    if (mb)
        mailbox_close(&mb);
    free(round_of);
    free(seq_of);
    buf_free(&got);
    buf_free(&want);
    buf_free(&problem);
    return rc;
}

/* In a child: create the mailbox and its quota root.  0 on success. */
static int tc_setup(const struct imapconf *conf)
{
    struct quota_db *q = NULL;
    unsigned round = 0;
    int r, rc = 1;

    if ((r = mailbox_create(conf, TC_MBOX, "default", "crash0001", 0)))
        TC_FAIL("mailbox_create: %s", store_strerror(r));
    if ((r = quota_open(conf, &q)))
        TC_FAIL("quota_open: %s", store_strerror(r));
    if ((r = quota_set(q, TC_MBOX, QUOTA_UNLIMITED, QUOTA_UNLIMITED)))
        TC_FAIL("quota_set: %s", store_strerror(r));
    rc = 0;
out:
    if (q)
        quota_close(&q);
    return rc;
}

/* In a child: one more append, acknowledged into *ack_r.  0 on success. */
static int tc_append_once(const struct imapconf *conf, struct tc_ack *ack_r)
{
    struct mailbox *mb = NULL;
    struct append_stage *st = NULL;
    struct append_txn *t = NULL;
    struct buf m = BUF_INITIALIZER;
    unsigned round = 999;
    int r, rc = 1;

    tc_message(&m, round, 0);
    if ((r = mailbox_open(conf, TC_MBOX, "default", &mb)) ||
        (r = append_stage_open(conf, NULL, &st)) ||
        (r = append_stage_write(st, m.s, m.len)) ||
        (r = append_stage_close(st)) ||
        (r = append_begin(conf, &t)) ||
        (r = append_add(t, mb, st, 0, 0, 0, &ack_r->uid)) ||
        (r = append_commit(t)))
        TC_FAIL("append after the kills: %s", store_strerror(r));
    ack_r->round = round;
    ack_r->seq = 0;
    rc = 0;
out:
    append_free(&t);
    append_stage_free(&st);
    if (mb)
        mailbox_close(&mb);
    buf_free(&m);
    return rc;
}

/* Run fn in a forked child; cmocka failure when it does not exit 0. */
static void tc_in_child(const char *what, unsigned round,
                        int (*fn)(const struct imapconf *, const struct tc_state *,
                                  unsigned),
                        const struct imapconf *conf, const struct tc_state *s)
{
    char sbuf[64];
    int status;
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        th_child_signals();
        alarm(TC_CHECK_S);
        _exit(fn(conf, s, round) == 0 ? 0 : 1);
    }
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("round %u: %s failed (%s)", round, what,
                 th_status_text(status, sbuf, sizeof(sbuf)));
}

static int tc_setup_fn(const struct imapconf *conf, const struct tc_state *s,
                       unsigned round)
{
    (void)s;
    (void)round;
    return tc_setup(conf);
}

/* Read the writer's acknowledgements until EOF. */
static void tc_collect_acks(int fd, struct tc_state *s)
{
    struct tc_ack a;
    size_t have = 0;
    ssize_t n;

    for (;;) {
        n = read(fd, (char *)&a + have, sizeof(a) - have);
        if (n < 0 && errno == EINTR)
            continue;
        assert_true(n >= 0);
        if (n == 0)
            break;
        have += (size_t)n;
        if (have < sizeof(a))
            continue;
        have = 0;
        assert_true(s->nacks < TC_MAX_ACKS);
        s->acks[s->nacks++] = a;
    }
    /* a torn acknowledgement (killed inside write) does not count */
}

/* Read one acknowledgement, waiting up to timeout seconds.  1: got one,
 * 0: end of file or timeout. */
static int tc_read_ack(int fd, double timeout, struct tc_ack *a)
{
    double end = th_now() + timeout;
    size_t have = 0;

    while (have < sizeof(*a)) {
        struct pollfd pfd = { fd, POLLIN, 0 };
        double left = end - th_now();
        ssize_t n;

        if (left <= 0)
            return 0;
        if (poll(&pfd, 1, (int)(left * 1000) + 1) <= 0)
            continue;
        n = read(fd, (char *)a + have, sizeof(*a) - have);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return 0;
        have += (size_t)n;
    }
    return 1;
}

/* lo * (hi/lo)^x for a pseudo-random x in [0, 1), in microseconds. */
static double tc_log_spread(unsigned *seed, double lo_s, double hi_s)
{
    double x = (double)(rand_r(seed) % 10000) / 10000.0, d = lo_s * 1e6;

    if (hi_s > lo_s)
        d *= exp(x * log(hi_s / lo_s));
    return d < TC_MAX_DELAY_US ? d : TC_MAX_DELAY_US;
}

static void test_append_crash(void **state)
{
    const char *backend = *state;
    char *dir = th_mkdtemp("appcrash");
    struct imapconf *conf = th_store_conf(dir, backend, TC_CONF);
    struct tc_state s = { NULL, 0 };
    struct th_timing open_t = TH_TIMING_INIT, first_t = TH_TIMING_INIT;
    unsigned round, kills = 0, seed = 12345, kills_in_commit = 0;
    unsigned sched_with_acks = 0, sched_without = 0;
    struct th_stretch stretch = TH_STRETCH_INIT;
    double t0 = th_now();
    char sbuf[64], c;
    int ackp[2], readyp[2], ackfinal[2], status;
    pid_t pid;

    /* This process opens no database and no mailbox: every step runs in
     * a child, so nothing the kills could leave behind (a Berkeley DB
     * environment a writer died in) is held open here across the
     * recovery that starts each check. */
    s.acks = calloc(TC_MAX_ACKS, sizeof(*s.acks));
    assert_non_null(s.acks);
    tc_in_child("setup", 0, tc_setup_fn, conf, &s);

    for (round = 1; round <= TC_ROUNDS_MAX; round++) {
        size_t before = s.nacks;
        int timing = round <= TC_CAL_ROUNDS || round % TC_CAL_EVERY == 0;
        int from_fork = !timing && round % 5 == 0;
        double delay = 0, t_fork, t_ready = 0;

        /* enough: the minimum of rounds is done, the budget or the usual
         * number of rounds is spent, and kills landed both inside the
         * first append and after a commit (else go on, up to
         * TC_ROUNDS_MAX, the schedule stretching as it goes) */
        if (round > TC_MIN_ROUNDS &&
            (round > TC_ROUNDS || th_now() - t0 > TC_BUDGET_S) &&
            sched_with_acks >= TC_MIN_EACH && sched_without >= TC_MIN_EACH)
            break;
        if (from_fork) {
            double o = th_timing_median(&open_t) * stretch.factor;
            double a = th_timing_median(&first_t) * stretch.factor;

            delay = tc_log_spread(&seed, (o + a) / 100, o + 2 * a);
        } else if (!timing) {
            double a = th_timing_median(&first_t) * stretch.factor;

            delay = tc_log_spread(&seed, a / 50, a * TC_SPAN_APPENDS);
        }
        assert_int_equal(pipe(ackp), 0);
        assert_int_equal(pipe(readyp), 0);
        t_fork = th_now();
        pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            close(ackp[0]);
            close(readyp[0]);
            tc_writer(conf, round, ackp[1], readyp[1]);
            _exit(1);
        }
        close(ackp[1]);
        close(readyp[1]);
        if (!from_fork) {
            struct pollfd pfd = { readyp[0], POLLIN, 0 };

            if (poll(&pfd, 1, (int)(TC_HANG_S * 1000)) != 1 ||
                read(readyp[0], &c, 1) != 1) {
                kill(pid, SIGKILL);
                waitpid(pid, &status, 0);
                fail_msg("round %u: writer never got ready (%s)", round,
                         th_status_text(status, sbuf, sizeof(sbuf)));
            }
            t_ready = th_now();
        }
        if (timing) {
            /* let it commit TC_CAL_APPENDS transactions, timing the first */
            struct tc_ack a;
            double t_first = 0;

            for (;;) {
                if (!tc_read_ack(ackp[0], TC_HANG_S, &a)) {
                    kill(pid, SIGKILL);
                    waitpid(pid, &status, 0);
                    fail_msg("round %u: a writer left alone acknowledged %zu "
                             "messages, then none in %.0f s (%s)", round,
                             s.nacks - before, TC_HANG_S,
                             th_status_text(status, sbuf, sizeof(sbuf)));
                }
                assert_true(s.nacks < TC_MAX_ACKS);
                s.acks[s.nacks++] = a;
                if (t_first == 0)
                    t_first = th_now();
                if (a.seq + 1 >= TC_CAL_APPENDS)
                    break;
            }
            th_timing_add(&open_t, t_ready - t_fork);
            th_timing_add(&first_t, t_first - t_ready);
        } else {
            th_sleep_us(delay);
        }
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        close(readyp[0]);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
            close(ackp[0]);
            fail_msg("round %u: writer ended by itself: %s", round,
                     th_status_text(status, sbuf, sizeof(sbuf)));
        }
        kills++;
        tc_collect_acks(ackp[0], &s);
        close(ackp[0]);
        if (s.nacks > before)
            kills_in_commit++;
        if (!timing) {
            if (s.nacks > before)
                sched_with_acks++;
            else
                sched_without++;
            th_stretch_note(&stretch, s.nacks > before);
        }
        tc_in_child("check", round, tc_check, conf, &s);
    }
    print_message("%s: %u kills, %zu messages acknowledged, %u rounds with "
                  "acknowledgements, scheduled kills %u inside the first "
                  "append and %u after a commit, open %.3f ms, first append "
                  "%.3f ms, stretch %g, %.1f s\n", backend, kills, s.nacks,
                  kills_in_commit, sched_without, sched_with_acks,
                  th_timing_median(&open_t) * 1e3,
                  th_timing_median(&first_t) * 1e3, stretch.factor,
                  th_now() - t0);
    /* the kills landed inside the first append and after commits (else
     * the schedule missed what it is meant to hit) */
    if (sched_without < TC_MIN_EACH || sched_with_acks < TC_MIN_EACH)
        fail_msg("%s: of %u scheduled kills %u landed inside the first "
                 "append and %u after a commit (at least %d of each needed), "
                 "with the first append measured at %.3f ms and the delays "
                 "stretched x%g", backend, stretch.n, sched_without,
                 sched_with_acks, TC_MIN_EACH,
                 th_timing_median(&first_t) * 1e3, stretch.factor);

    /* the mailbox still takes mail, and then everything still holds */
    assert_int_equal(pipe(ackfinal), 0);
    pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        struct tc_ack a;

        th_child_signals();
        alarm(TC_CHECK_S);
        close(ackfinal[0]);
        if (tc_append_once(conf, &a) != 0 ||
            tc_write_all(ackfinal[1], &a, sizeof(a)) != 0)
            _exit(1);
        _exit(0);
    }
    close(ackfinal[1]);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    {
        size_t n = s.nacks;

        tc_collect_acks(ackfinal[0], &s);
        close(ackfinal[0]);
        assert_int_equal(s.nacks, n + 1);
    }
    tc_in_child("final check", round, tc_check, conf, &s);
#ifdef TC_JOURNAL
    {
        /* the appends did go through the journal */
        struct commit_shared_stats cs;

        assert_int_equal(commit_shared_stats(conf, &cs), STORE_OK);
        /* some commits may go the group way (a writer killed inside a
         * record leaves the journal to the next replay), so only "the
         * journal was used" is a rule; the share is printed */
        assert_true(cs.journal_records >= 1);
        printf("journal records %llu for %zu acknowledged messages\n",
               (unsigned long long)cs.journal_records, (size_t)s.nacks);
    }
#endif

    free(s.acks);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
}

int main(void)
{
    static const struct th_case cases[] = {
        { "append_crash", test_append_crash },
    };

    log_init("test_append_crash",
             getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    signal(SIGPIPE, SIG_IGN);
    return th_run_per_backend("append_crash", cases,
                              sizeof(cases) / sizeof(cases[0]));
}
