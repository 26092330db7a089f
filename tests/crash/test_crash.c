/*
 * test_crash.c - a writer SIGKILLed at many moments, every backend.
 *
 * For each backend (narrowed by $TEST_BACKENDS), on ONE database file that
 * lives through all the kills, so that damage would accumulate:
 *
 *   writer (forked): opens the file, then runs transactions n = L+1, L+2,
 *   ... where L is the value of the "last" key.  Transaction n stores
 *   K keys "n:<n>:<j>" (values derived from n and j, some of them several
 *   KiB), overwrites "last" with n, deletes what transaction n-2 wrote
 *   (all of it, or all but key 0 when n-2 is a multiple of 8, so that old
 *   records stay around), commits, and only then writes n to a pipe.
 *   Every 25th transaction it also calls cyrusdb_checkpoint(), so kills
 *   land inside checkpoints too.
 *
 *   parent: SIGKILLs the writer after a delay that differs per round,
 *   spread logarithmically from a fiftieth of a commit to forty commits
 *   (mostly counted from the moment the writer has opened the file,
 *   sometimes from fork(), then over the open and twenty commits), so the
 *   kill lands before, inside and after commits.  How long an open and a
 *   commit take is measured first and again as the run goes (see "The
 *   kill schedule" below): the schedule fits a fast machine and a slow,
 *   loaded one alike, and the verdict does not depend on the speed.
 *
 *   checker (forked): cyrusdb_recover(dir) (what ctl_cyrusdb -r does at
 *   system start; a no-op for backends that need none), reopen, and check
 *   the state is exactly "all transactions up to L", where L is read from
 *   "last": every transaction the writer reported is there, at most the
 *   one in flight beyond it (entirely, never in part), nothing later; the
 *   whole walk holds exactly the expected records with the expected
 *   values; cyrusdb_consistent() passes; a store + commit still works.
 *
 * open-kill (second case, every backend): openers that open, store one
 * record and close in a loop are SIGKILLed after a delay from fork()
 * spread from a hundredth of to three times the measured duration of
 * their first open/store/close cycle, half of the kills inside that cycle
 * (for db3: many inside Berkeley DB's environment open), half after it.
 * After every kill a fresh process, with no recovery run, must open,
 * write and read back (a check that takes minutes has hung).
 *
 * db3-nosync does not sync at commit: a process crash may lose recently
 * committed transactions (Berkeley DB keeps them in its log buffer), so
 * for it L may lie below what the writer reported; the state must still be
 * exactly some whole prefix of the transactions.  For every other backend
 * a reported commit must survive.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/log.h"
#include "tests/testhelp.h"

#define CRASH_MIN_ROUNDS 60      /* kills per backend, at least */
#define CRASH_MAX_ROUNDS 400     /* ... and more while time is left */
#define CRASH_BUDGET_S 7.0       /* per backend */
#define CRASH_KEYS 4             /* keys stored per transaction */
#define CRASH_CHILD_LIFE_S 600.0 /* a writer or opener never killed gives up */
#define CRASH_CHECKPOINT_EVERY 25
#define CRASH_VALUE_MAX 8192

/* What the checker hands back to the parent (MAP_SHARED). */
struct crash_shared {
    long found_last;     /* "last" after recovery, -1 if unknown */
    long records;        /* records met by the walk */
};

static void crash_child_fail(const char *who, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void crash_child_fail(const char *who, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "crash: %s[%ld]: ", who, (long)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}


/* Send this child's stderr (its own messages and the backend's log lines)
 * to `path`, replaced every round: a passing run stays quiet, a failing
 * one prints the files of the round that failed. */
static void crash_child_stderr(const char *path)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);

    if (fd >= 0) {
        dup2(fd, STDERR_FILENO);
        close(fd);
    }
}

/* Print the last bytes of a child's log file. */
static void crash_show_log(const char *what, const char *path)
{
    char buf[4096];
    ssize_t n;
    off_t size;
    int fd = open(path, O_RDONLY | O_CLOEXEC);

    if (fd < 0)
        return;
    size = lseek(fd, 0, SEEK_END);
    if (size > (off_t)sizeof(buf) - 1)
        lseek(fd, size - (off_t)sizeof(buf) + 1, SEEK_SET);
    else
        lseek(fd, 0, SEEK_SET);
    n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = '\0';
    printf("---- %s (%s) ----\n%s", what, path, buf);
    if (buf[n - 1] != '\n')
        putchar('\n');
}

/* ---- the data model ----------------------------------------------------- */

static size_t crash_key(char *buf, unsigned long m, unsigned j)
{
    return (size_t)snprintf(buf, 32, "n:%08lu:%u", m, j);
}

/* Value of key j of transaction m: a readable head, then pseudo-random
 * bytes (NULs included); key 0 of every 5th transaction is ~6 KiB. */
static size_t crash_value(char *buf, unsigned long m, unsigned j)
{
    size_t len = 24 + (m * 131 + j * 71) % 400;
    int n;

    if (j == 0 && m % 5 == 0)
        len += 6000;
    n = snprintf(buf, 24, "%lu/%u:", m, j);
    th_fill(buf + n, len - (size_t)n, (unsigned)(m * 8 + j));
    return len;
}

/* Should key j of transaction m exist once transaction L committed? */
static int crash_present(unsigned long m, unsigned j, unsigned long L)
{
    if (m < 1 || m > L)
        return 0;
    if (m + 2 > L)          /* not yet deleted by transaction m + 2 */
        return 1;
    return m % 8 == 0 && j != 0;
}

static long crash_expected_records(unsigned long L)
{
    long n = 2;             /* "last" and "probe" */
    unsigned long m;
    unsigned j;

    for (m = 1; m <= L; m++)
        for (j = 0; j < CRASH_KEYS; j++)
            n += crash_present(m, j, L);
    return n;
}

/* ---- writer --------------------------------------------------------------- */

static int crash_txn(struct cyrusdb *db, unsigned long n, const char **why_r)
{
    struct cyrusdb_txn *tid = NULL;
    char key[32], val[CRASH_VALUE_MAX], num[32];
    size_t kl, vl;
    unsigned j;
    int r = CYRUSDB_OK;

    for (j = 0; j < CRASH_KEYS && r == CYRUSDB_OK; j++) {
        kl = crash_key(key, n, j);
        vl = crash_value(val, n, j);
        *why_r = "store";
        r = cyrusdb_store(db, key, kl, val, vl, &tid);
    }
    if (r == CYRUSDB_OK) {
        int nl = snprintf(num, sizeof(num), "%lu", n);
        *why_r = "store last";
        r = cyrusdb_store(db, "last", 4, num, (size_t)nl, &tid);
    }
    if (r == CYRUSDB_OK && n >= 3) {
        unsigned long m = n - 2;
        for (j = 0; j < CRASH_KEYS && r == CYRUSDB_OK; j++) {
            if (m % 8 == 0 && j != 0)
                continue;
            kl = crash_key(key, m, j);
            *why_r = "delete (force=0) a record of transaction n-2";
            r = cyrusdb_delete(db, key, kl, &tid, 0);
        }
    }
    if (r != CYRUSDB_OK) {
        if (tid)
            cyrusdb_abort(db, tid);
        return r;
    }
    if (!tid) {
        *why_r = "stores returned OK without a transaction";
        return CYRUSDB_INTERNAL;
    }
    *why_r = "commit";
    return cyrusdb_commit(db, tid);
}

static int crash_write_all(int fd, const void *p, size_t len)
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

/* Runs until killed; returns only on failure. */
static int crash_writer(const char *backend, const char *fname, unsigned long start,
                        int fd)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL, *why = NULL;
    unsigned long n = start, ready = 0;
    double t0 = th_now();
    int r;

    r = cyrusdb_open(backend, fname, 0, &db, &err);
    if (r != CYRUSDB_OK) {
        crash_child_fail("writer", "open: %s (%s)", cyrusdb_strerror(r), err ? err : "");
        return 1;
    }
    if (crash_write_all(fd, &ready, sizeof(ready)) < 0)
        return 1;
    while (th_now() - t0 < CRASH_CHILD_LIFE_S) {
        r = crash_txn(db, n, &why);
        if (r == CYRUSDB_AGAIN)
            continue;
        if (r != CYRUSDB_OK) {
            crash_child_fail("writer", "transaction %lu: %s: %s", n, why, cyrusdb_strerror(r));
            return 1;
        }
        if (crash_write_all(fd, &n, sizeof(n)) < 0)
            return 1;
        if (n % CRASH_CHECKPOINT_EVERY == 0) {
            r = cyrusdb_checkpoint(db);
            if (r != CYRUSDB_OK && r != CYRUSDB_NOTIMPLEMENTED) {
                crash_child_fail("writer", "checkpoint after %lu: %s", n, cyrusdb_strerror(r));
                return 1;
            }
        }
        n++;
    }
    crash_child_fail("writer", "was never killed");
    return 1;
}

/* ---- checker ---------------------------------------------------------------- */

struct crash_walk {
    unsigned long last;
    long records;
    char val[CRASH_VALUE_MAX];
    char problem[256];
};

static int crash_walk_cb(void *rock, const char *key, size_t keylen,
                         const char *data, size_t datalen)
{
    struct crash_walk *w = rock;
    unsigned long m = 0;
    unsigned j;
    size_t i, vl;

    w->records++;
    if ((keylen == 4 && !memcmp(key, "last", 4)) || (keylen == 5 && !memcmp(key, "probe", 5)))
        return 0;   /* checked by fetch */
    if (keylen != 12 || memcmp(key, "n:", 2) != 0 || key[10] != ':' ||
        key[11] < '0' || key[11] >= '0' + CRASH_KEYS) {
        snprintf(w->problem, sizeof(w->problem), "walk met a key that was never written: "
                 "len %zu \"%.*s\"", keylen, (int)(keylen < 40 ? keylen : 40), key);
        return 1;
    }
    for (i = 2; i < 10; i++) {
        if (key[i] < '0' || key[i] > '9') {
            snprintf(w->problem, sizeof(w->problem), "walk met a malformed key \"%.12s\"", key);
            return 1;
        }
        m = m * 10 + (unsigned long)(key[i] - '0');
    }
    j = (unsigned)(key[11] - '0');
    if (!crash_present(m, j, w->last)) {
        snprintf(w->problem, sizeof(w->problem), "walk met %.12s, which must not exist "
                 "when last=%lu (%s)", key, w->last,
                 m > w->last ? "a later transaction in part" : "a deletion was lost");
        return 1;
    }
    vl = crash_value(w->val, m, j);
    if (datalen != vl || memcmp(data, w->val, vl) != 0) {
        snprintf(w->problem, sizeof(w->problem), "walk: %.12s has a wrong value "
                 "(len %zu, expected %zu)", key, datalen, vl);
        return 1;
    }
    return 0;
}

/* lo..hi: the range "last" may have; round: this checker's number. */
static int crash_check(const char *backend, const char *dir, const char *fname,
                       long lo, long hi, int round, int nosync,
                       struct crash_shared *sh)
{
    struct cyrusdb *db = NULL;
    struct cyrusdb_txn *tid = NULL;
    struct crash_walk *w;
    const char *err = NULL, *data;
    char key[32], probe[32];
    size_t len, kl, vl;
    unsigned long m;
    unsigned j;
    long L, expect;
    int r, pl;

    r = cyrusdb_recover(dir);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "recover: %s", cyrusdb_strerror(r));
        return 1;
    }
    r = cyrusdb_open(backend, fname, 0, &db, &err);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "reopen after the kill: %s (%s)", cyrusdb_strerror(r),
                         err ? err : "");
        return 1;
    }
    w = calloc(1, sizeof(*w));
    if (!w)
        return 1;
    r = cyrusdb_fetch(db, "last", 4, &data, &len, NULL);
    if (r != CYRUSDB_OK || (L = th_parse_long(data, len)) < 0) {
        crash_child_fail("check", "fetch last: %s", r ? cyrusdb_strerror(r) : "does not parse");
        goto bad;
    }
    sh->found_last = L;
    if (L < lo || L > hi) {
        crash_child_fail("check", "last=%ld after recovery, expected %ld..%ld (%s)", L, lo, hi,
                         L < lo ? "a reported commit was lost" : "a transaction nobody wrote");
        goto bad;
    }

    /* the probe of the previous checker (it may be older under nosync) */
    r = cyrusdb_fetch(db, "probe", 5, &data, &len, NULL);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "fetch probe: %s", cyrusdb_strerror(r));
        goto bad;
    }
    pl = snprintf(probe, sizeof(probe), "probe-%d", round - 1);
    if (!nosync && (len != (size_t)pl || memcmp(data, probe, len) != 0)) {
        crash_child_fail("check", "probe is \"%.*s\", expected \"%s\"",
                         (int)(len < 30 ? len : 30), data, probe);
        goto bad;
    }

    /* every record of every transaction up to L, and a little past it */
    for (m = L > 40 ? (unsigned long)L - 40 : 1; m <= (unsigned long)L + 2; m++) {
        for (j = 0; j < CRASH_KEYS; j++) {
            int want = crash_present(m, j, (unsigned long)L);
            kl = crash_key(key, m, j);
            r = cyrusdb_fetch(db, key, kl, &data, &len, NULL);
            if (want && r != CYRUSDB_OK) {
                crash_child_fail("check", "last=%ld: fetch %s: %s (expected present)",
                                 L, key, cyrusdb_strerror(r));
                goto bad;
            }
            if (!want && r != CYRUSDB_NOTFOUND) {
                crash_child_fail("check", "last=%ld: fetch %s: %s (expected NOTFOUND)",
                                 L, key, cyrusdb_strerror(r));
                goto bad;
            }
            if (want) {
                vl = crash_value(w->val, m, j);
                if (len != vl || memcmp(data, w->val, vl) != 0) {
                    crash_child_fail("check", "last=%ld: %s has a wrong value", L, key);
                    goto bad;
                }
            }
        }
    }

    /* the walk must hold exactly the expected records */
    w->last = (unsigned long)L;
    r = cyrusdb_foreach(db, NULL, 0, NULL, crash_walk_cb, w, NULL);
    if (w->problem[0]) {
        crash_child_fail("check", "%s", w->problem);
        goto bad;
    }
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "foreach: %s", cyrusdb_strerror(r));
        goto bad;
    }
    expect = crash_expected_records((unsigned long)L);
    sh->records = w->records;
    if (w->records != expect) {
        crash_child_fail("check", "last=%ld: walk met %ld records, expected %ld",
                         L, w->records, expect);
        goto bad;
    }

    r = cyrusdb_consistent(db);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "consistent after recovery: %s", cyrusdb_strerror(r));
        goto bad;
    }

    /* still writable */
    pl = snprintf(probe, sizeof(probe), "probe-%d", round);
    r = cyrusdb_store(db, "probe", 5, probe, (size_t)pl, &tid);
    if (r == CYRUSDB_OK)
        r = cyrusdb_commit(db, tid);
    else if (tid)
        cyrusdb_abort(db, tid);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "store+commit after recovery: %s", cyrusdb_strerror(r));
        goto bad;
    }
    r = cyrusdb_fetch(db, "probe", 5, &data, &len, NULL);
    if (r != CYRUSDB_OK || len != (size_t)pl || memcmp(data, probe, len) != 0) {
        crash_child_fail("check", "probe not read back after commit: %s", cyrusdb_strerror(r));
        goto bad;
    }
    free(w);
    r = cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "close: %s", cyrusdb_strerror(r));
        return 1;
    }
    return 0;

bad:
    free(w);
    cyrusdb_close(&db);
    return 1;
}

static int crash_init(const char *backend, const char *fname)
{
    struct cyrusdb *db = NULL;
    struct cyrusdb_txn *tid = NULL;
    const char *err = NULL;
    int r;

    r = cyrusdb_open(backend, fname, CYRUSDB_CREATE, &db, &err);
    if (r != CYRUSDB_OK) {
        crash_child_fail("init", "open: %s (%s)", cyrusdb_strerror(r), err ? err : "");
        return 1;
    }
    r = cyrusdb_store(db, "last", 4, "0", 1, &tid);
    if (r == CYRUSDB_OK)
        r = cyrusdb_store(db, "probe", 5, "probe-0", 7, &tid);
    if (r == CYRUSDB_OK)
        r = cyrusdb_commit(db, tid);
    else if (tid)
        cyrusdb_abort(db, tid);
    if (r != CYRUSDB_OK) {
        crash_child_fail("init", "store+commit: %s", cyrusdb_strerror(r));
        cyrusdb_close(&db);
        return 1;
    }
    return cyrusdb_close(&db) == CYRUSDB_OK ? 0 : 1;
}

/* ---- parent ------------------------------------------------------------------ */

/* Wait for pid up to timeout seconds; SIGKILL it past that.  Returns 0, or
 * -1 when it had to be killed. */
static int crash_wait(pid_t pid, double timeout, int *status_r)
{
    double end = th_now() + timeout;

    for (;;) {
        pid_t w = waitpid(pid, status_r, WNOHANG);
        if (w == pid)
            return 0;
        if (w < 0 && errno != EINTR) {
            *status_r = 0x7f00;
            return 0;
        }
        if (th_now() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, status_r, 0);
            return -1;
        }
        usleep(1000);
    }
}

/* Read one token from fd, waiting up to timeout seconds.  1: got one,
 * 0: end of file or timeout (*timed_out_r says which), -1: error. */
static int crash_read_token(int fd, double timeout, unsigned long *token_r,
                            int *timed_out_r)
{
    double end = th_now() + timeout;

    *timed_out_r = 0;
    for (;;) {
        struct pollfd pfd = { .fd = fd, .events = POLLIN };
        double left = end - th_now();
        ssize_t n;
        int p;

        if (left <= 0) {
            *timed_out_r = 1;
            return 0;
        }
        p = poll(&pfd, 1, (int)(left * 1000) + 1);
        if (p < 0 && errno == EINTR)
            continue;
        if (p < 0)
            return -1;
        if (p == 0)
            continue;
        n = read(fd, token_r, sizeof(*token_r));
        if (n < 0 && errno == EINTR)
            continue;
        return n == (ssize_t)sizeof(*token_r) ? 1 : 0;
    }
}

/*
 * The kill schedule of the writer case.  Nothing in it is a fixed
 * duration: it is measured on this machine, in this build, as the run
 * goes.
 *
 * Timing rounds (the first CRASH_CAL_ROUNDS, then one in CRASH_CAL_EVERY)
 * let the writer open and commit CRASH_CAL_TXNS transactions while the
 * parent timestamps its reports, then kill it (a kill mid-run, checked
 * like any other).  They give O, the median time from fork() to the open
 * completing, and T, the median of the per-round medians of the time
 * between two commits.
 *
 * Every other round kills after a delay spread logarithmically over
 * [T/50, CRASH_SPAN_TXNS * T] * S counted from the open (so before the
 * first commit, inside commits, inside checkpoints, after dozens), or, one
 * round in four, over [(O + 20 T) / 100, O + 20 T] * S counted from fork()
 * (so inside the open too).  S, the stretch (th_stretch_note), starts at
 * 1, doubles when fewer than a tenth of the recent scheduled kills landed
 * after a commit (the machine slowed down since the last timing) and
 * halves when fewer than a tenth landed before the first one.  The run
 * goes on past its budget (up to CRASH_MAX_ROUNDS) until the writers
 * committed at least one transaction per kill on average.
 */
#define CRASH_STEPS 60            /* distinct delay steps */
#define CRASH_CAL_ROUNDS 3        /* timing rounds first ... */
#define CRASH_CAL_EVERY 20        /* ... and one in this many later on */
#define CRASH_CAL_TXNS 12         /* commits a timing round waits for */
#define CRASH_SPAN_TXNS 40.0      /* longest delay from open, in commits */
#define CRASH_FORK_SPAN_TXNS 20.0 /* ... from fork(), past the open */
#define CRASH_MAX_DELAY_US 20e6
#define CRASH_HANG_S 300.0        /* an open, commit or check that takes longer hangs */

/* Position of round i in [0, 1]: the CRASH_STEPS steps visited in a
 * scrambled order (37 is prime to CRASH_STEPS), with a small jitter so no
 * two rounds are equal. */
static double crash_step(int i)
{
    int step = (i * 37) % CRASH_STEPS;

    return ((double)step + 0.9 * (double)((i * 13) % 11) / 11.0) / CRASH_STEPS;
}

/* lo * (hi/lo)^x, in microseconds, capped. */
static double crash_log_spread(double lo_s, double hi_s, double x)
{
    double d = lo_s * 1e6;

    if (hi_s > lo_s)
        d *= exp(x * log(hi_s / lo_s));
    return d < CRASH_MAX_DELAY_US ? d : CRASH_MAX_DELAY_US;
}

enum crash_kind { CRASH_FROM_OPEN, CRASH_FROM_FORK, CRASH_TIMING };

static void test_crash(void **state)
{
    const char *backend = *state;
    char *dir = th_mkdtemp("crash");
    char *fname = th_path(dir, "crash.db");
    char *logdir = th_mkdtemp("crashlog");   /* apart: recover scans dir */
    char *writer_log = th_path(logdir, "writer.log");
    char *check_log = th_path(logdir, "check.log");
    struct crash_shared *sh;
    struct th_timing open_t = TH_TIMING_INIT, txn_t = TH_TIMING_INIT;
    char failure[1024] = "";
    char sbuf[64];
    int nosync = !strcmp(backend, "db3-nosync");
    int status, round;
    long base = 0;            /* state verified before the current round */
    long committed_total = 0, inflight_landed = 0, idle_kills = 0, lost = 0;
    struct th_stretch stretch = TH_STRETCH_INIT;
    double t0 = th_now();
    pid_t pid;

    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        th_child_signals();
        crash_child_stderr(check_log);
        _exit(crash_init(backend, fname));
    }
    if (pid < 0 || crash_wait(pid, CRASH_HANG_S, &status) < 0 ||
        !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(failure, sizeof(failure), "%s: creating the database failed (%s)", backend,
                 pid < 0 ? "fork" : th_status_text(status, sbuf, sizeof(sbuf)));
        goto out;
    }

    for (round = 1; round <= CRASH_MAX_ROUNDS; round++) {
        enum crash_kind kind;
        double delay = 0, t_fork, t_ready = 0, gaps[CRASH_CAL_TXNS], t_prev = 0;
        unsigned long token, reported = 0;
        int fds[2], got_ready = 0, timed_out = 0, ngaps = 0;
        long hi;

        if (round <= CRASH_CAL_ROUNDS || round % CRASH_CAL_EVERY == 0)
            kind = CRASH_TIMING;
        else
            kind = (round % 4 == 0) ? CRASH_FROM_FORK : CRASH_FROM_OPEN;
        if (kind == CRASH_FROM_OPEN) {
            double T = th_timing_median(&txn_t) * stretch.factor;
            delay = crash_log_spread(T / 50, T * CRASH_SPAN_TXNS, crash_step((int)stretch.n));
        } else if (kind == CRASH_FROM_FORK) {
            double w = (th_timing_median(&open_t) +
                        CRASH_FORK_SPAN_TXNS * th_timing_median(&txn_t)) * stretch.factor;
            delay = crash_log_spread(w / 100, w, crash_step((int)stretch.n));
        }

        if (pipe(fds) < 0) {
            snprintf(failure, sizeof(failure), "pipe: %s", strerror(errno));
            goto out;
        }
        fflush(stdout);
        fflush(stderr);
        t_fork = th_now();
        pid = fork();
        if (pid == 0) {
            th_child_signals();
            crash_child_stderr(writer_log);
            close(fds[0]);
            _exit(crash_writer(backend, fname, (unsigned long)base + 1, fds[1]));
        }
        close(fds[1]);
        if (pid < 0) {
            close(fds[0]);
            snprintf(failure, sizeof(failure), "fork: %s", strerror(errno));
            goto out;
        }
        if (kind != CRASH_FROM_FORK) {
            if (crash_read_token(fds[0], CRASH_HANG_S, &token, &timed_out) == 1 && token == 0) {
                got_ready = 1;
                t_ready = t_prev = th_now();
            }
        }
        if (kind == CRASH_TIMING) {
            while (got_ready && ngaps < CRASH_CAL_TXNS &&
                   crash_read_token(fds[0], CRASH_HANG_S, &token, &timed_out) == 1) {
                double now = th_now();
                if (token != (reported ? reported + 1 : (unsigned long)base + 1)) {
                    snprintf(failure, sizeof(failure), "%s: round %d: writer reported %lu "
                             "out of sequence", backend, round, token);
                    kill(pid, SIGKILL);
                    waitpid(pid, &status, 0);
                    close(fds[0]);
                    goto out;
                }
                reported = token;
                gaps[ngaps++] = now - t_prev;
                t_prev = now;
            }
        } else if (got_ready || kind == CRASH_FROM_FORK) {
            th_sleep_us(delay);
        }
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        while (read(fds[0], &token, sizeof(token)) == (ssize_t)sizeof(token)) {
            if (token == 0) {
                got_ready = 1;
                continue;
            }
            if (token != (reported ? reported + 1 : (unsigned long)base + 1)) {
                snprintf(failure, sizeof(failure), "%s: round %d: writer reported %lu "
                         "out of sequence", backend, round, token);
                close(fds[0]);
                goto out;
            }
            reported = token;
        }
        close(fds[0]);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
            snprintf(failure, sizeof(failure), "%s: round %d: the writer died before the "
                     "kill (%s); its messages follow", backend, round,
                     th_status_text(status, sbuf, sizeof(sbuf)));
            goto out;
        }
        if (kind != CRASH_FROM_FORK && !got_ready) {
            snprintf(failure, sizeof(failure), "%s: round %d: writer never opened the file%s",
                     backend, round, timed_out ? " (waited 300 s)" : "");
            goto out;
        }
        if (kind == CRASH_TIMING) {
            if (ngaps < CRASH_CAL_TXNS) {
                snprintf(failure, sizeof(failure), "%s: round %d: the writer committed only "
                         "%d transactions%s", backend, round, ngaps,
                         timed_out ? ", then none in 300 s" : "");
                goto out;
            }
            th_timing_add(&open_t, t_ready - t_fork);
            th_timing_add(&txn_t, th_median(gaps, (size_t)ngaps));
        }
        if (reported == 0)
            reported = (unsigned long)base;
        hi = (long)reported + 1;

        /* recover and check in a fresh process */
        sh->found_last = -1;
        sh->records = 0;
        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid == 0) {
            th_child_signals();
            crash_child_stderr(check_log);
            _exit(crash_check(backend, dir, fname, nosync ? 0 : (long)reported, hi,
                              round, nosync, sh));
        }
        if (pid < 0 || crash_wait(pid, CRASH_HANG_S, &status) < 0 ||
            !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            char when[64];

            if (kind == CRASH_TIMING)
                snprintf(when, sizeof(when), "right after commit %lu was reported", reported);
            else
                snprintf(when, sizeof(when), "%.0f us after %s", delay,
                         kind == CRASH_FROM_FORK ? "fork" : "open");
            snprintf(failure, sizeof(failure), "%s: round %d (kill %s, writer reported "
                     "up to %lu, started at %ld): check after recovery failed (%s); its "
                     "messages follow", backend, round, when, reported, base + 1,
                     pid < 0 ? "fork" : th_status_text(status, sbuf, sizeof(sbuf)));
            goto out;
        }
        if (sh->found_last == hi)
            inflight_landed++;
        if (sh->found_last < (long)reported)
            lost += (long)reported - sh->found_last;
        if ((long)reported == base && sh->found_last == base)
            idle_kills++;
        committed_total += sh->found_last - base;
        if (kind != CRASH_TIMING)
            th_stretch_note(&stretch, (long)reported > base);   /* after a commit? */
        base = sh->found_last;
        /* enough: the minimum of rounds and the time budget are spent, and
         * the kills hit a writer that was writing (or go on, stretched) */
        if (round >= CRASH_MIN_ROUNDS && th_now() - t0 > CRASH_BUDGET_S &&
            committed_total >= round)
            break;
    }

    if (round > CRASH_MAX_ROUNDS)
        round = CRASH_MAX_ROUNDS;
    printf("crash backend=<%s> kills=%d elapsed=%.2fs open_ms=%.3f commit_ms=%.3f "
           "stretch=%g transactions=%ld final_last=%ld records=%ld "
           "inflight_commit_survived=%ld kills_before_first_commit=%ld "
           "lost_after_commit=%ld\n", backend, round, th_now() - t0,
           th_timing_median(&open_t) * 1e3, th_timing_median(&txn_t) * 1e3, stretch.factor,
           committed_total, base, sh->records, inflight_landed, idle_kills, lost);
    fflush(stdout);
    /* the kills must have hit a writer that was writing, most of the time */
    if (committed_total < round)
        snprintf(failure, sizeof(failure), "%s: only %ld transactions in %d rounds: the "
                 "writer hardly ran, so the kills tested little", backend, committed_total,
                 round);

out:
    if (failure[0]) {
        crash_show_log("writer's messages", writer_log);
        crash_show_log("checker's messages", check_log);
        fflush(stdout);
    }
    munmap(sh, sizeof(*sh));
    th_rmrf(dir);
    th_rmrf(logdir);
    free(fname);
    free(dir);
    free(writer_log);
    free(check_log);
    free(logdir);
    if (failure[0])
        fail_msg("%s", failure);
}

/* ---- kills inside open and close ----------------------------------------- */

/*
 * The kill schedule of the open-kill case, measured as the crash case's
 * is.  Timing rounds (the first OPENKILL_CAL_ROUNDS, then one in
 * OPENKILL_CAL_EVERY) let an opener run until it reports its first
 * open/store/close cycle, which gives U, the median time from fork() to
 * the end of that cycle on this machine, in this build, on a database
 * like the one every opener finds (just closed by the previous checker);
 * they then kill it at a varying point of its later cycles.  Every other
 * round kills after a delay counted from fork(): half of the steps
 * spread logarithmically over [U/100, U] (before and inside the first
 * open, many of them in Berkeley DB's environment open), half evenly over
 * [U, 3 U] (in the close and in later cycles), all times S, the stretch
 * (th_stretch_note: it doubles when fewer than a tenth of the recent
 * kills landed after the first cycle, halves when fewer than a tenth
 * landed inside it), so the schedule follows the machine when it slows
 * down or speeds up during the run.  The run goes on past its budget (up
 * to OPENKILL_MAX_ROUNDS) until at least OPENKILL_MIN_EACH kills landed
 * on each side.
 */
#define OPENKILL_MIN_ROUNDS 40    /* kills per backend, at least */
#define OPENKILL_MAX_ROUNDS 400   /* ... and more while time is left or needed */
#define OPENKILL_BUDGET_S 3.0     /* per backend */
#define OPENKILL_STEPS 24         /* distinct delay steps */
#define OPENKILL_CAL_ROUNDS 3     /* timing rounds first ... */
#define OPENKILL_CAL_EVERY 16     /* ... and one in this many later on */
#define OPENKILL_MIN_EACH 8       /* kills inside and after the first cycle, at least */
#define OPENKILL_HANG_S 120.0     /* an open or check that takes longer hangs */

/* Opener (forked): open, store one small record, close, again and again,
 * until killed; each cycle is reported on the pipe.  Returns only on
 * failure. */
static int openkill_opener(const char *backend, const char *fname, int fd)
{
    char key[32];
    unsigned long n = 0;
    double t0 = th_now();
    int kl, r;

    kl = snprintf(key, sizeof(key), "opener-%ld", (long)getpid());
    while (th_now() - t0 < CRASH_CHILD_LIFE_S) {
        struct cyrusdb *db = NULL;
        const char *err = NULL;

        r = cyrusdb_open(backend, fname, CYRUSDB_CREATE, &db, &err);
        if (r != CYRUSDB_OK) {
            crash_child_fail("opener", "open (cycle %lu): %s (%s)", n, cyrusdb_strerror(r),
                             err ? err : "");
            return 1;
        }
        r = cyrusdb_store(db, key, (size_t)kl, "x", 1, NULL);
        if (r != CYRUSDB_OK && r != CYRUSDB_AGAIN) {
            crash_child_fail("opener", "store (cycle %lu): %s", n, cyrusdb_strerror(r));
            cyrusdb_close(&db);
            return 1;
        }
        r = cyrusdb_close(&db);
        if (r != CYRUSDB_OK) {
            crash_child_fail("opener", "close (cycle %lu): %s", n, cyrusdb_strerror(r));
            return 1;
        }
        n++;
        if (crash_write_all(fd, &n, sizeof(n)) < 0)
            return 1;
    }
    crash_child_fail("opener", "was never killed");
    return 1;
}

/* Checker (forked, no recovery run): open, write, read back, close. */
static int openkill_check(const char *backend, const char *fname, int round)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL, *data;
    char val[32];
    size_t len;
    int vl, r;

    r = cyrusdb_open(backend, fname, 0, &db, &err);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "open: %s (%s)", cyrusdb_strerror(r), err ? err : "");
        return 1;
    }
    vl = snprintf(val, sizeof(val), "round-%d", round);
    r = cyrusdb_store(db, "probe", 5, val, (size_t)vl, NULL);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "store: %s", cyrusdb_strerror(r));
        cyrusdb_close(&db);
        return 1;
    }
    r = cyrusdb_fetch(db, "probe", 5, &data, &len, NULL);
    if (r != CYRUSDB_OK || len != (size_t)vl || memcmp(data, val, len) != 0) {
        crash_child_fail("check", "probe not read back: %s", cyrusdb_strerror(r));
        cyrusdb_close(&db);
        return 1;
    }
    r = cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        crash_child_fail("check", "close: %s", cyrusdb_strerror(r));
        return 1;
    }
    return 0;
}

/* Delay of scheduled round i, in units of U (see above): the steps are
 * visited in a scrambled order (7 is prime to OPENKILL_STEPS), with a
 * small jitter so no two rounds are equal. */
static double openkill_delay_units(int i)
{
    double x = ((double)((i * 7) % OPENKILL_STEPS) +
                0.9 * (double)((i * 13) % 11) / 11.0) / OPENKILL_STEPS;

    if (x < 0.5)
        return 0.01 * exp(2 * x * log(100.0));
    return 1.0 + 2.0 * (2 * x - 1.0);
}

/*
 * Processes SIGKILLed while they open or close a database (for db3: while
 * Berkeley DB creates, joins or leaves the environment shared by the whole
 * directory), without any recovery run in between: after every kill a
 * fresh process must open the database, write and read back (within
 * OPENKILL_HANG_S, else it hangs).  One mail delivery worker killed at the
 * wrong moment must not hang or break every other one.
 */
static void test_open_kill(void **state)
{
    const char *backend = *state;
    char *dir = th_mkdtemp("openkill");
    char *fname = th_path(dir, "open.db");
    char *logdir = th_mkdtemp("openkilllog");
    char *opener_log = th_path(logdir, "opener.log");
    char *check_log = th_path(logdir, "check.log");
    struct th_timing cycle_t = TH_TIMING_INIT;
    char failure[1024] = "";
    char sbuf[64];
    struct th_stretch stretch = TH_STRETCH_INIT;
    long cycles = 0, inside = 0, after = 0;
    double t0 = th_now();
    int status, round;
    pid_t pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        th_child_signals();
        crash_child_stderr(check_log);
        _exit(crash_init(backend, fname));
    }
    if (pid < 0 || crash_wait(pid, OPENKILL_HANG_S, &status) < 0 ||
        !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        snprintf(failure, sizeof(failure), "%s: creating the database failed (%s)", backend,
                 pid < 0 ? "fork" : th_status_text(status, sbuf, sizeof(sbuf)));
        goto out;
    }
    for (round = 1; round <= OPENKILL_MAX_ROUNDS; round++) {
        int timing = round <= OPENKILL_CAL_ROUNDS || round % OPENKILL_CAL_EVERY == 0;
        double delay = 0, t_fork, first = 0;
        unsigned long token, reported = 0;
        int fds[2], hung, timed_out = 0;
        char when[96];

        if (!timing)
            delay = th_timing_median(&cycle_t) * 1e6 * stretch.factor *
                    openkill_delay_units((int)stretch.n);
        if (pipe(fds) < 0) {
            snprintf(failure, sizeof(failure), "pipe: %s", strerror(errno));
            goto out;
        }
        fflush(stdout);
        fflush(stderr);
        t_fork = th_now();
        pid = fork();
        if (pid == 0) {
            th_child_signals();
            crash_child_stderr(opener_log);
            close(fds[0]);
            _exit(openkill_opener(backend, fname, fds[1]));
        }
        close(fds[1]);
        if (pid < 0) {
            close(fds[0]);
            snprintf(failure, sizeof(failure), "fork: %s", strerror(errno));
            goto out;
        }
        if (timing) {
            if (crash_read_token(fds[0], OPENKILL_HANG_S, &token, &timed_out) == 1) {
                first = th_now() - t_fork;
                reported = token;
                /* somewhere in the next cycles */
                th_sleep_us(first * 1e6 * openkill_delay_units(round));
            }
        } else {
            th_sleep_us(delay < 20e6 ? delay : 20e6);
        }
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        while (read(fds[0], &token, sizeof(token)) == (ssize_t)sizeof(token))
            reported = token;
        close(fds[0]);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGKILL) {
            snprintf(failure, sizeof(failure), "%s: round %d: the opener died before the "
                     "kill (%s); its messages follow", backend, round,
                     th_status_text(status, sbuf, sizeof(sbuf)));
            goto out;
        }
        if (timing && first == 0) {
            snprintf(failure, sizeof(failure), "%s: round %d: an opener left alone did not "
                     "complete its first open/store/close cycle%s; its messages follow",
                     backend, round, timed_out ? " in 120 s" : "");
            goto out;
        }
        cycles += (long)reported;
        if (timing) {
            th_timing_add(&cycle_t, first);
            snprintf(when, sizeof(when), "%.0f us after its first cycle ended (%.0f us "
                     "after fork)", first * 1e6 * openkill_delay_units(round), first * 1e6);
        } else {
            /* killed inside its first open/store/close cycle, or after it */
            if (reported == 0)
                inside++;
            else
                after++;
            th_stretch_note(&stretch, reported > 0);
            snprintf(when, sizeof(when), "%.0f us after fork", delay);
        }

        fflush(stdout);
        fflush(stderr);
        pid = fork();
        if (pid == 0) {
            th_child_signals();
            crash_child_stderr(check_log);
            _exit(openkill_check(backend, fname, round));
        }
        if (pid < 0) {
            snprintf(failure, sizeof(failure), "fork: %s", strerror(errno));
            goto out;
        }
        hung = crash_wait(pid, OPENKILL_HANG_S, &status) < 0;
        if (hung || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            snprintf(failure, sizeof(failure), "%s: round %d (opener killed %s, after %lu "
                     "open/store/close cycles): the next open %s; its messages follow",
                     backend, round, when, reported,
                     hung ? "hung (killed after 120 s)"
                          : th_status_text(status, sbuf, sizeof(sbuf)));
            goto out;
        }
        if (round >= OPENKILL_MIN_ROUNDS && th_now() - t0 > OPENKILL_BUDGET_S &&
            inside >= OPENKILL_MIN_EACH && after >= OPENKILL_MIN_EACH)
            break;
    }
    if (round > OPENKILL_MAX_ROUNDS)
        round = OPENKILL_MAX_ROUNDS;
    printf("open-kill backend=<%s> kills=%d elapsed=%.2fs first_cycle_ms=%.3f stretch=%g "
           "cycles=%ld kills_in_first_cycle=%ld kills_after_it=%ld\n", backend, round,
           th_now() - t0, th_timing_median(&cycle_t) * 1e3, stretch.factor, cycles, inside,
           after);
    fflush(stdout);
    /* kills must land inside the first open/store/close cycle and after
     * it: otherwise the delays missed what they are meant to hit */
    if (inside < OPENKILL_MIN_EACH || after < OPENKILL_MIN_EACH)
        snprintf(failure, sizeof(failure), "%s: of %u scheduled kills %ld landed inside the "
                 "first open/store/close cycle and %ld after it (at least %d of each "
                 "needed), with that cycle measured at %.3f ms and the delays stretched "
                 "x%g: the delays do not cover open", backend, stretch.n, inside, after,
                 OPENKILL_MIN_EACH, th_timing_median(&cycle_t) * 1e3, stretch.factor);

out:
    if (failure[0]) {
        crash_show_log("opener's messages", opener_log);
        crash_show_log("checker's messages", check_log);
        fflush(stdout);
    }
    th_rmrf(dir);
    th_rmrf(logdir);
    free(fname);
    free(dir);
    free(opener_log);
    free(check_log);
    free(logdir);
    if (failure[0])
        fail_msg("%s", failure);
}

int main(void)
{
    static const struct th_case cases[] = {
        { "crash", test_crash },
        { "open-kill", test_open_kill },
    };

    log_init("test_crash", LOG_TO_STDERR);
    return th_run_per_backend("crash", cases, sizeof(cases) / sizeof(cases[0]));
}
