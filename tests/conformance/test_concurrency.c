/*
 * test_concurrency.c - several processes on one database file, every backend.
 *
 * For each backend of the registry (narrowed by $TEST_BACKENDS):
 *   - 8 forked writers each run 2,000 read-increment-write-commit cycles
 *     (16,000 transactions): one
 *     transaction does cyrusdb_fetchlock() on one of 4 counter keys (chosen
 *     pseudo-randomly), stores it + 1, fetches the "total" key inside the
 *     same transaction, stores it + 1, and commits.  A lost update would
 *     leave a counter or the total short.
 *   - 2 forked readers meanwhile fetch every key (tid NULL) and walk the
 *     whole database with cyrusdb_foreach() (tid NULL).  Each walk is one
 *     snapshot: in it, total must equal the sum of the counters (the walk
 *     would see a half-committed transaction otherwise), every value must
 *     parse, and no value may go backwards between reads of one reader.
 *   - At the end a verifier checks every counter equals the number of
 *     committed increments the writers made to it, total equals
 *     writers * cycles, and cyrusdb_consistent() passes.
 *
 * Every process opens its own handle after fork().  CYRUSDB_AGAIN (a db3
 * deadlock) aborts the transaction, which is then retried; retries are
 * counted and reported.  The parent never touches a database itself, so
 * its failures cannot leave a handle shared across fork().
 */
#include "config.h"

#include <errno.h>
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

#define CONC_WRITERS 8
#define CONC_READERS 2
#define CONC_COUNTERS 4
#define CONC_CYCLES 2000          /* per writer: 16,000 transactions in all */
#define CONC_TIMEOUT_MS 150000    /* a case that takes longer has hung */

static const char *const conc_keys[CONC_COUNTERS + 1] = {
    "counter.0", "counter.1", "counter.2", "counter.3", "total"
};
#define CONC_TOTAL CONC_COUNTERS  /* index of "total" in conc_keys */

/* Shared between the parent and its children (MAP_SHARED). */
struct conc_shared {
    int stop;                                   /* readers: finish up */
    long expect_total;                          /* set before stop */
    long increments[CONC_WRITERS][CONC_COUNTERS];
    long writer_retries[CONC_WRITERS];
    long reader_walks[CONC_READERS];
    long reader_fetch_rounds[CONC_READERS];
    long reader_retries[CONC_READERS];
    long reader_last_total[CONC_READERS];
};

/* Child-side failure report: children never use cmocka assertions (a
 * longjmp there would run the rest of the suite in the child). */
static void conc_child_fail(const char *who, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
static void conc_child_fail(const char *who, const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "concurrency: %s[%ld]: ", who, (long)getpid());
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

static int conc_key_index(const char *key, size_t keylen)
{
    int i;

    for (i = 0; i <= CONC_COUNTERS; i++)
        if (strlen(conc_keys[i]) == keylen && !memcmp(conc_keys[i], key, keylen))
            return i;
    return -1;
}

static int conc_store_long(struct cyrusdb *db, const char *key, long v,
                           struct cyrusdb_txn **tid)
{
    char val[32];
    int n = snprintf(val, sizeof(val), "%ld", v);

    return cyrusdb_store(db, key, strlen(key), val, (size_t)n, tid);
}

/* ---- children ---------------------------------------------------------- */

static int conc_init(const char *backend, const char *fname)
{
    struct cyrusdb *db = NULL;
    struct cyrusdb_txn *tid = NULL;
    const char *err = NULL;
    int i, r;

    r = cyrusdb_open(backend, fname, CYRUSDB_CREATE, &db, &err);
    if (r != CYRUSDB_OK) {
        conc_child_fail("init", "open %s: %s (%s)", fname,
                        cyrusdb_strerror(r), err ? err : "");
        return 1;
    }
    for (i = 0; i <= CONC_COUNTERS && r == CYRUSDB_OK; i++)
        r = conc_store_long(db, conc_keys[i], 0, &tid);
    if (r == CYRUSDB_OK)
        r = cyrusdb_commit(db, tid);
    else if (tid)
        cyrusdb_abort(db, tid);
    if (r != CYRUSDB_OK) {
        conc_child_fail("init", "store/commit: %s", cyrusdb_strerror(r));
        cyrusdb_close(&db);
        return 1;
    }
    r = cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        conc_child_fail("init", "close: %s", cyrusdb_strerror(r));
        return 1;
    }
    return 0;
}

/* One read-increment-write-commit transaction on counter k.  Returns a
 * cyrusdb code; *why_r says which step failed. */
static int conc_cycle(struct cyrusdb *db, int k, const char **why_r)
{
    struct cyrusdb_txn *tid = NULL;
    const char *data;
    size_t len;
    long v, total;
    int r;

    *why_r = "fetchlock";
    r = cyrusdb_fetchlock(db, conc_keys[k], strlen(conc_keys[k]), &data, &len, &tid);
    if (r == CYRUSDB_OK && !tid) {
        *why_r = "fetchlock returned OK without a transaction";
        return CYRUSDB_INTERNAL;
    }
    if (r != CYRUSDB_OK)
        goto fail;
    if ((v = th_parse_long(data, len)) < 0) {
        *why_r = "counter value does not parse";
        r = CYRUSDB_INTERNAL;
        goto fail;
    }
    *why_r = "store counter";
    if ((r = conc_store_long(db, conc_keys[k], v + 1, &tid)) != CYRUSDB_OK)
        goto fail;
    *why_r = "fetch total in transaction";
    r = cyrusdb_fetch(db, conc_keys[CONC_TOTAL], strlen(conc_keys[CONC_TOTAL]),
                      &data, &len, &tid);
    if (r != CYRUSDB_OK)
        goto fail;
    if ((total = th_parse_long(data, len)) < 0) {
        *why_r = "total value does not parse";
        r = CYRUSDB_INTERNAL;
        goto fail;
    }
    *why_r = "store total";
    if ((r = conc_store_long(db, conc_keys[CONC_TOTAL], total + 1, &tid)) != CYRUSDB_OK)
        goto fail;
    *why_r = "commit";
    return cyrusdb_commit(db, tid);   /* frees tid whatever it returns */

fail:
    if (tid)
        cyrusdb_abort(db, tid);
    return r;
}

static int conc_writer(const char *backend, const char *fname, int idx,
                       int cycles, struct conc_shared *sh)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL, *why = NULL;
    uint32_t seed = 2463534242u + (uint32_t)idx * 7919u;
    int done = 0, r;

    r = cyrusdb_open(backend, fname, 0, &db, &err);
    if (r != CYRUSDB_OK) {
        conc_child_fail("writer", "open: %s (%s)", cyrusdb_strerror(r), err ? err : "");
        return 1;
    }
    while (done < cycles) {
        int k;

        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        k = (int)(seed % CONC_COUNTERS);
        r = conc_cycle(db, k, &why);
        if (r == CYRUSDB_AGAIN) {
            sh->writer_retries[idx]++;
            continue;
        }
        if (r != CYRUSDB_OK) {
            conc_child_fail("writer", "cycle %d on %s: %s: %s", done, conc_keys[k],
                            why, cyrusdb_strerror(r));
            cyrusdb_close(&db);
            return 1;
        }
        sh->increments[idx][k]++;
        done++;
    }
    r = cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        conc_child_fail("writer", "close: %s", cyrusdb_strerror(r));
        return 1;
    }
    return 0;
}

struct conc_walk {
    long val[CONC_COUNTERS + 1];
    int seen[CONC_COUNTERS + 1];
    char prev[64];
    size_t prevlen;
    int records;
    char problem[256];
};

static int conc_walk_cb(void *rock, const char *key, size_t keylen,
                        const char *data, size_t datalen)
{
    struct conc_walk *w = rock;
    int i = conc_key_index(key, keylen);

    w->records++;
    if (i < 0) {
        snprintf(w->problem, sizeof(w->problem), "walk met an unknown key (len %zu)", keylen);
        return 1;
    }
    if (w->seen[i]) {
        snprintf(w->problem, sizeof(w->problem), "walk met %s twice", conc_keys[i]);
        return 1;
    }
    if (w->prevlen && cyrusdb_compare(0, w->prev, w->prevlen, key, keylen) >= 0) {
        snprintf(w->problem, sizeof(w->problem), "walk out of order at %s", conc_keys[i]);
        return 1;
    }
    memcpy(w->prev, key, keylen);
    w->prevlen = keylen;
    w->seen[i] = 1;
    if ((w->val[i] = th_parse_long(data, datalen)) < 0) {
        snprintf(w->problem, sizeof(w->problem), "walk: value of %s does not parse (len %zu)",
                 conc_keys[i], datalen);
        return 1;
    }
    return 0;
}

static int conc_reader(const char *backend, const char *fname, int idx,
                       struct conc_shared *sh)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL;
    long last[CONC_COUNTERS + 1] = { 0 };
    int final = 0, r, i;
    /* reader 0 uses a read-only handle, reader 1 a read-write one */
    int flags = idx == 0 ? CYRUSDB_RDONLY : 0;

    r = cyrusdb_open(backend, fname, flags, &db, &err);
    if (r != CYRUSDB_OK) {
        conc_child_fail("reader", "open: %s (%s)", cyrusdb_strerror(r), err ? err : "");
        return 1;
    }
    for (;;) {
        struct conc_walk w;
        long sum = 0;

        if (__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE))
            final = 1;   /* writers are gone: one last round, then stop */

        /* single fetches, each its own read transaction */
        for (i = 0; i <= CONC_COUNTERS; i++) {
            const char *data = NULL;
            size_t len = 0;
            long v;

            r = cyrusdb_fetch(db, conc_keys[i], strlen(conc_keys[i]), &data, &len, NULL);
            if (r == CYRUSDB_AGAIN) {
                sh->reader_retries[idx]++;
                i--;
                continue;
            }
            if (r != CYRUSDB_OK) {
                conc_child_fail("reader", "fetch %s: %s", conc_keys[i], cyrusdb_strerror(r));
                goto bad;
            }
            if ((v = th_parse_long(data, len)) < 0) {
                conc_child_fail("reader", "fetch %s: value does not parse (len %zu)",
                                conc_keys[i], len);
                goto bad;
            }
            if (v < last[i]) {
                conc_child_fail("reader", "fetch %s went backwards: %ld after %ld",
                                conc_keys[i], v, last[i]);
                goto bad;
            }
            last[i] = v;
        }
        sh->reader_fetch_rounds[idx]++;

        /* one walk = one snapshot */
        do {
            memset(&w, 0, sizeof(w));
            r = cyrusdb_foreach(db, NULL, 0, NULL, conc_walk_cb, &w, NULL);
            if (r == CYRUSDB_AGAIN)
                sh->reader_retries[idx]++;
        } while (r == CYRUSDB_AGAIN && !w.problem[0]);
        if (w.problem[0]) {
            conc_child_fail("reader", "%s", w.problem);
            goto bad;
        }
        if (r != CYRUSDB_OK) {
            conc_child_fail("reader", "foreach: %s", cyrusdb_strerror(r));
            goto bad;
        }
        for (i = 0; i <= CONC_COUNTERS; i++) {
            if (!w.seen[i]) {
                conc_child_fail("reader", "walk did not meet %s (%d records)",
                                conc_keys[i], w.records);
                goto bad;
            }
            if (w.val[i] < last[i]) {
                conc_child_fail("reader", "walk: %s went backwards: %ld after %ld",
                                conc_keys[i], w.val[i], last[i]);
                goto bad;
            }
            last[i] = w.val[i];
            if (i < CONC_TOTAL)
                sum += w.val[i];
        }
        if (sum != w.val[CONC_TOTAL]) {
            conc_child_fail("reader", "snapshot not committed state: total=%ld but "
                            "counters sum to %ld (%ld %ld %ld %ld)", w.val[CONC_TOTAL],
                            sum, w.val[0], w.val[1], w.val[2], w.val[3]);
            goto bad;
        }
        sh->reader_walks[idx]++;
        sh->reader_last_total[idx] = w.val[CONC_TOTAL];
        if (!final) {
            /* a short pause: two readers spinning flat out on two cores
             * would mostly measure the scheduler */
            usleep(200);
            continue;
        }
        if (w.val[CONC_TOTAL] != sh->expect_total) {
            conc_child_fail("reader", "after the writers: total=%ld, expected %ld",
                            w.val[CONC_TOTAL], sh->expect_total);
            goto bad;
        }
        break;
    }
    r = cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        conc_child_fail("reader", "close: %s", cyrusdb_strerror(r));
        return 1;
    }
    return 0;

bad:
    cyrusdb_close(&db);
    return 1;
}

static int conc_verify(const char *backend, const char *fname, struct conc_shared *sh,
                       int writers)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL;
    long sum = 0, v[CONC_COUNTERS + 1];
    int i, w, r, bad = 0;

    r = cyrusdb_open(backend, fname, 0, &db, &err);
    if (r != CYRUSDB_OK) {
        conc_child_fail("verify", "open: %s (%s)", cyrusdb_strerror(r), err ? err : "");
        return 1;
    }
    for (i = 0; i <= CONC_COUNTERS; i++) {
        const char *data;
        size_t len;
        long expect = 0;

        r = cyrusdb_fetch(db, conc_keys[i], strlen(conc_keys[i]), &data, &len, NULL);
        if (r != CYRUSDB_OK || (v[i] = th_parse_long(data, len)) < 0) {
            conc_child_fail("verify", "fetch %s: %s", conc_keys[i],
                            r ? cyrusdb_strerror(r) : "value does not parse");
            bad = 1;
            continue;
        }
        if (i < CONC_TOTAL) {
            for (w = 0; w < writers; w++)
                expect += sh->increments[w][i];
            sum += v[i];
        } else {
            expect = sh->expect_total;
        }
        if (v[i] != expect) {
            conc_child_fail("verify", "%s=%ld, expected %ld (lost updates: %ld)",
                            conc_keys[i], v[i], expect, expect - v[i]);
            bad = 1;
        }
    }
    if (!bad && sum != sh->expect_total) {
        conc_child_fail("verify", "counters sum to %ld, expected %ld", sum, sh->expect_total);
        bad = 1;
    }
    r = cyrusdb_consistent(db);
    if (r != CYRUSDB_OK) {
        conc_child_fail("verify", "consistent: %s", cyrusdb_strerror(r));
        bad = 1;
    }
    r = cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        conc_child_fail("verify", "close: %s", cyrusdb_strerror(r));
        bad = 1;
    }
    return bad;
}

/* ---- parent ------------------------------------------------------------ */

struct conc_proc {
    pid_t pid;
    const char *role;
    int status;
    int done;
};

/* Wait for every process in procs until the deadline; past it, SIGKILL
 * the ones still running.  Returns the number killed for the timeout. */
static int conc_reap(struct conc_proc *procs, int n, double deadline,
                     struct conc_shared *sh, int nwriters)
{
    int left, i, killed = 0, writers_left;

    for (;;) {
        left = 0;
        writers_left = 0;
        for (i = 0; i < n; i++) {
            if (procs[i].done)
                continue;
            if (waitpid(procs[i].pid, &procs[i].status, WNOHANG) == procs[i].pid) {
                procs[i].done = 1;
                continue;
            }
            left++;
            if (i < nwriters)
                writers_left++;
        }
        /* once every writer is gone, tell the readers to finish */
        if (writers_left == 0 && sh && !__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE))
            __atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
        if (left == 0)
            return killed;
        if (th_now() > deadline) {
            for (i = 0; i < n; i++) {
                if (!procs[i].done) {
                    kill(procs[i].pid, SIGKILL);
                    waitpid(procs[i].pid, &procs[i].status, 0);
                    procs[i].done = 1;
                    killed++;
                }
            }
            return killed;
        }
        usleep(2000);
    }
}

static pid_t conc_spawn(int (*fn)(const char *, const char *, int, struct conc_shared *, int),
                        const char *backend, const char *fname, int idx,
                        struct conc_shared *sh, int arg)
{
    pid_t pid;

    fflush(stdout);
    fflush(stderr);
    pid = fork();
    if (pid == 0) {
        int rc;

        th_child_signals();
        rc = fn(backend, fname, idx, sh, arg);
        fflush(stderr);
        _exit(rc);
    }
    return pid;
}

static int conc_run_init(const char *backend, const char *fname, int idx,
                         struct conc_shared *sh, int arg)
{
    (void)idx; (void)sh; (void)arg;
    return conc_init(backend, fname);
}

static int conc_run_writer(const char *backend, const char *fname, int idx,
                           struct conc_shared *sh, int cycles)
{
    return conc_writer(backend, fname, idx, cycles, sh);
}

static int conc_run_reader(const char *backend, const char *fname, int idx,
                           struct conc_shared *sh, int arg)
{
    (void)arg;
    return conc_reader(backend, fname, idx, sh);
}

static int conc_run_verify(const char *backend, const char *fname, int idx,
                           struct conc_shared *sh, int writers)
{
    (void)idx;
    return conc_verify(backend, fname, sh, writers);
}

/* Cycles per writer: 2,000 (16,000 transactions in all) for every
 * backend; $TEST_CONC_CYCLES overrides it, for experiments. */
static int conc_cycles_for(const char *backend)
{
    const char *env = getenv("TEST_CONC_CYCLES");

    (void)backend;
    if (env && atoi(env) > 0)
        return atoi(env);
    return CONC_CYCLES;
}

static void test_concurrency(void **state)
{
    const char *backend = *state;
    char *dir = th_mkdtemp("conc");
    char *fname = th_path(dir, "conc.db");
    struct conc_shared *sh;
    struct conc_proc procs[CONC_WRITERS + CONC_READERS];
    struct conc_proc one;
    char failure[1024] = "";
    char sbuf[64];
    int cycles = conc_cycles_for(backend);
    int i, n = 0;
    long retries = 0;
    double t0, t1;

    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    assert_true(sh != MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    sh->expect_total = (long)CONC_WRITERS * cycles;

    /* create the database with every key at 0 */
    memset(&one, 0, sizeof(one));
    one.pid = conc_spawn(conc_run_init, backend, fname, 0, sh, 0);
    one.role = "init";
    conc_reap(&one, 1, th_now() + 60, NULL, 0);
    if (!WIFEXITED(one.status) || WEXITSTATUS(one.status) != 0) {
        snprintf(failure, sizeof(failure), "%s: creating the database failed (%s)",
                 backend, th_status_text(one.status, sbuf, sizeof(sbuf)));
        goto out;
    }

    /* writers first in procs[], then readers */
    t0 = th_now();
    for (i = 0; i < CONC_WRITERS; i++) {
        procs[n].pid = conc_spawn(conc_run_writer, backend, fname, i, sh, cycles);
        procs[n].role = "writer";
        procs[n].done = 0;
        n++;
    }
    for (i = 0; i < CONC_READERS; i++) {
        procs[n].pid = conc_spawn(conc_run_reader, backend, fname, i, sh, 0);
        procs[n].role = "reader";
        procs[n].done = 0;
        n++;
    }
    for (i = 0; i < n; i++) {
        if (procs[i].pid < 0) {
            procs[i].done = 1;
            procs[i].status = 0x7f00;
        }
    }
    if (conc_reap(procs, n, t0 + CONC_TIMEOUT_MS / 1000.0, sh, CONC_WRITERS) > 0) {
        snprintf(failure, sizeof(failure), "%s: processes still running after %d s "
                 "(a hang or deadlock); killed", backend, CONC_TIMEOUT_MS / 1000);
        goto out;
    }
    t1 = th_now();
    for (i = 0; i < n; i++) {
        if (!WIFEXITED(procs[i].status) || WEXITSTATUS(procs[i].status) != 0) {
            snprintf(failure, sizeof(failure), "%s: %s %d failed (%s); see its message above",
                     backend, procs[i].role, i < CONC_WRITERS ? i : i - CONC_WRITERS,
                     th_status_text(procs[i].status, sbuf, sizeof(sbuf)));
            goto out;
        }
    }
    for (i = 0; i < CONC_WRITERS; i++)
        retries += sh->writer_retries[i];
    printf("concurrency backend=<%s> writers=%d cycles=%d elapsed=%.2fs "
           "txn_per_s=%.0f writer_retries=%ld reader_walks=%ld+%ld "
           "reader_fetch_rounds=%ld+%ld reader_retries=%ld+%ld\n",
           backend, CONC_WRITERS, cycles, t1 - t0,
           (double)sh->expect_total / (t1 - t0), retries,
           sh->reader_walks[0], sh->reader_walks[1],
           sh->reader_fetch_rounds[0], sh->reader_fetch_rounds[1],
           sh->reader_retries[0], sh->reader_retries[1]);
    fflush(stdout);

    /* the readers must have looked while the writers ran, not only after */
    for (i = 0; i < CONC_READERS; i++) {
        if (sh->reader_walks[i] < 2) {
            snprintf(failure, sizeof(failure), "%s: reader %d made only %ld walks",
                     backend, i, sh->reader_walks[i]);
            goto out;
        }
    }

    memset(&one, 0, sizeof(one));
    one.pid = conc_spawn(conc_run_verify, backend, fname, 0, sh, CONC_WRITERS);
    one.role = "verify";
    conc_reap(&one, 1, th_now() + 60, NULL, 0);
    if (!WIFEXITED(one.status) || WEXITSTATUS(one.status) != 0)
        snprintf(failure, sizeof(failure), "%s: final check failed (%s); see above",
                 backend, th_status_text(one.status, sbuf, sizeof(sbuf)));

out:
    munmap(sh, sizeof(*sh));
    th_rmrf(dir);
    free(fname);
    free(dir);
    if (failure[0])
        fail_msg("%s", failure);
}

int main(void)
{
    static const struct th_case cases[] = {
        { "concurrency", test_concurrency },
    };

    log_init("test_concurrency", LOG_TO_STDERR);
    return th_run_per_backend("concurrency", cases, 1);
}
