/*
 * test_commit.c - the durable commit path's modes and group commit
 * (store/commit.h).
 *
 * Real files and directories on the real disk ($TEST_TMPDIR or the build
 * tree), real fork()ed processes sharing CONFIGDIR/commit.shm:
 *   - spool_sync file, off, group and a NULL configuration
 *     each commit files and directories, with the per-process and shared
 *     counters each mode must move, and the error mapping (a closed
 *     descriptor, a missing directory);
 *   - 8 processes x 200 commits at once in group mode: every commit OK,
 *     fewer syncfs() calls than commits, and no commit returns before a
 *     round that began after it was called had finished (the shared round
 *     counters read just before and just after each call);
 *   - a leader SIGKILLed inside its round: the followers finish within a
 *     bounded time and the round counts as abandoned; a process SIGKILLed
 *     while holding the shared mutex: the next committer repairs it
 *     (EOWNERDEAD) and commits;
 *   - a failed round (an errno injected through the test hook instead of
 *     syncfs()) fails every member of that round, and only that round;
 *   - a short, a damaged and an earlier boot's commit.shm: refused by
 *     commit_shared_stats(), replaced by the next commit;
 *   - a configdirectory that cannot hold commit.shm: the commit is made
 *     file by file (fallback) and still succeeds.
 * The white-box part: the damaged-file case knows that the boot id lives
 * at offset 16 of commit.shm (commit.c, struct commit_shm).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
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
#include <time.h>
#include <unistd.h>

#include <setjmp.h>
#include <cmocka.h>

#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/commit.h"
#include "store/store.h"
#include "tests/testhelp.h"

#define TC_PROCS 8
#define TC_COMMITS 200
#define TC_FOLLOWERS 3
#define TC_BOUND 60.0         /* seconds after which a follower has hung */
#define TC_EVENT_S 60.0       /* generous deadline for an awaited event */

/* ---- helpers ------------------------------------------------------------- */

/* A new file dir/name with `len` bytes written; returns the open fd. */
static int tc_file(const char *dir, const char *name, size_t len)
{
    char path[4096], buf[4096];
    int fd;

    snprintf(path, sizeof(path), "%s/%s", dir, name);
    fd = open(path, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    assert_true(fd >= 0);
    th_fill(buf, sizeof(buf), (unsigned)len);
    while (len > 0) {
        size_t n = len < sizeof(buf) ? len : sizeof(buf);

        assert_int_equal(write(fd, buf, n), (ssize_t)n);
        len -= n;
    }
    return fd;
}

static char *tc_mkdir(const char *dir, const char *name)
{
    char *p = th_path(dir, name);

    assert_int_equal(mkdir(p, 0755), 0);
    return p;
}

static void tc_shared(const struct imapconf *conf,
                      struct commit_shared_stats *st)
{
    assert_int_equal(commit_shared_stats(conf, st), STORE_OK);
}

/* One commit of a new file in dir plus dir itself; the store code. */
static int tc_commit_one(const struct imapconf *conf, const char *dir,
                         const char *name)
{
    struct commit_batch *b = NULL;
    int fd, r;

    fd = tc_file(dir, name, 1000);
    if (commit_batch_new(conf, &b) != STORE_OK)
        return STORE_NOMEM;
    if (commit_batch_add_fd(b, fd) != STORE_OK ||
        commit_batch_add_dir(b, dir) != STORE_OK)
        r = STORE_INTERNAL;
    else
        r = commit_batch_sync(b);
    commit_batch_free(&b);
    close(fd);
    return r;
}

/* Wait for pid at most `secs`; its wait status, or -1 on timeout. */
static int tc_wait(pid_t pid, double secs)
{
    double end = th_now() + secs;
    int status;
    pid_t w;

    for (;;) {
        w = waitpid(pid, &status, WNOHANG);
        if (w == pid)
            return status;
        assert_true(w == 0);
        if (th_now() > end)
            return -1;
        usleep(5000);
    }
}

static void tc_kill(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

/* Read one byte from fd within `secs`; 1 when one came. */
static int tc_read_byte(int fd, double secs)
{
    struct pollfd p = { .fd = fd, .events = POLLIN };
    char c;

    if (poll(&p, 1, (int)(secs * 1000)) != 1)
        return 0;
    return read(fd, &c, 1) == 1;
}

static void tc_child_start(void)
{
    th_child_signals();
    alarm(300);          /* never outlive a broken test */
}

/* ---- the modes ------------------------------------------------------------ */

static void test_mode_file(void **state)
{
    char *dir = th_mkdtemp("commit-file"), *spool, *sub, *missing;
    struct imapconf *conf;
    struct commit_batch *b = NULL;
    struct commit_stats s0, s1;
    struct commit_shared_stats sh;
    int fd1, fd2, fd3;

    (void)state;
    conf = th_store_conf(dir, "flat", "spool_sync: file\n");
    assert_string_equal(imapconf_getstring(conf, "spool_sync"), "file");
    spool = th_path(dir, "spool");
    sub = tc_mkdir(spool, "a");
    missing = th_path(spool, "missing");
    /* no commit yet: no shared state */
    assert_int_equal(commit_shared_stats(conf, &sh), STORE_NOTFOUND);

    fd1 = tc_file(sub, "one", 5000);
    fd2 = tc_file(spool, "two", 100);
    assert_int_equal(commit_batch_new(conf, &b), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd1), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd2), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, sub), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, spool), STORE_OK);
    commit_stats_get(&s0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds - s0.rounds, 1);
    assert_int_equal(s1.file_syncs - s0.file_syncs, 2);
    assert_int_equal(s1.dir_syncs - s0.dir_syncs, 2);
    assert_int_equal(s1.rounds_led - s0.rounds_led, 0);
    assert_int_equal(s1.fallbacks - s0.fallbacks, 0);
    tc_shared(conf, &sh);
    assert_int_equal(sh.commits, 1);
    assert_int_equal(sh.file_syncs, 2);
    assert_int_equal(sh.dir_syncs, 2);
    assert_int_equal(sh.syncfs_calls, 0);
    assert_int_equal(sh.rounds_started, 0);

    /* errors: a closed descriptor, a directory that does not exist */
    fd3 = open(sub, O_RDONLY);
    assert_true(fd3 >= 0);
    close(fd3);
    assert_int_equal(commit_batch_add_fd(b, fd3), STORE_OK);
    assert_int_equal(commit_batch_sync(b), STORE_IOERROR);
    assert_int_equal(commit_batch_add_dir(b, missing), STORE_OK);
    assert_int_equal(commit_batch_sync(b), STORE_IOERROR);
    tc_shared(conf, &sh);
    assert_int_equal(sh.commits, 3);

    commit_batch_free(&b);
    close(fd1);
    close(fd2);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
    free(sub);
    free(missing);
}

static void test_mode_off(void **state)
{
    char *dir = th_mkdtemp("commit-off"), *spool, *path;
    struct imapconf *conf;
    struct commit_batch *b = NULL;
    struct commit_stats s0, s1;
    struct commit_shared_stats sh;
    struct stat st;
    int fd;

    (void)state;
    conf = th_store_conf(dir, "flat", "spool_sync: off\n");
    spool = th_path(dir, "spool");
    fd = tc_file(spool, "msg", 13870);
    assert_int_equal(commit_batch_new(conf, &b), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, spool), STORE_OK);
    commit_stats_get(&s0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds - s0.rounds, 1);     /* counted */
    assert_int_equal(s1.file_syncs - s0.file_syncs, 0);
    assert_int_equal(s1.dir_syncs - s0.dir_syncs, 0);
    assert_int_equal(s1.rounds_led - s0.rounds_led, 0);
    tc_shared(conf, &sh);
    assert_int_equal(sh.commits, 1);
    assert_int_equal(sh.file_syncs + sh.dir_syncs + sh.syncfs_calls, 0);
    /* the data is there all the same (page cache) */
    path = th_path(spool, "msg");
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 13870);
    /* off does not even look at the descriptors: nothing to fail */
    commit_batch_free(&b);
    close(fd);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
    free(path);
}

static void test_mode_group(void **state)
{
    char *dir = th_mkdtemp("commit-group"), *spool, *sub, *sub2, *missing;
    struct imapconf *conf;
    struct commit_batch *b = NULL;
    struct commit_stats s0, s1;
    struct commit_shared_stats sh;
    int fd1, fd2, fd3;

    (void)state;
    conf = th_store_conf(dir, "flat", "spool_sync: group\n");
    /* asked for explicitly (the default is journal) */
    assert_string_equal(imapconf_getstring(conf, "spool_sync"), "group");
    spool = th_path(dir, "spool");
    sub = tc_mkdir(spool, "a");
    sub2 = tc_mkdir(spool, "b");
    missing = th_path(spool, "missing");

    fd1 = tc_file(sub, "one", 20000);
    fd2 = tc_file(spool, "index", 300);
    assert_int_equal(commit_batch_new(conf, &b), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd2), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd1), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, sub), STORE_OK);
    commit_stats_get(&s0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.rounds - s0.rounds, 1);
    assert_int_equal(s1.rounds_led - s0.rounds_led, 1);   /* alone: leads */
    assert_int_equal(s1.rounds_joined - s0.rounds_joined, 0);
    assert_int_equal(s1.file_syncs - s0.file_syncs, 0);
    assert_int_equal(s1.dir_syncs - s0.dir_syncs, 0);
    assert_int_equal(s1.fallbacks - s0.fallbacks, 0);
    tc_shared(conf, &sh);
    assert_int_equal(sh.commits, 1);
    assert_int_equal(sh.syncfs_calls, 1);
    assert_int_equal(sh.rounds_started, 1);
    assert_int_equal(sh.rounds_done, 1);
    assert_int_equal(sh.file_syncs + sh.dir_syncs, 0);

    /* only directories: the leader opens one for its syncfs() */
    assert_int_equal(commit_batch_add_dir(b, sub2), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, spool), STORE_OK);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    tc_shared(conf, &sh);
    assert_int_equal(sh.syncfs_calls, 2);
    assert_int_equal(sh.rounds_done, 2);

    /* errors as in "file" */
    fd3 = open(sub, O_RDONLY);
    assert_true(fd3 >= 0);
    close(fd3);
    assert_int_equal(commit_batch_add_fd(b, fd1), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd3), STORE_OK);
    assert_int_equal(commit_batch_sync(b), STORE_IOERROR);
    assert_int_equal(commit_batch_add_fd(b, fd1), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, missing), STORE_OK);
    assert_int_equal(commit_batch_sync(b), STORE_IOERROR);
    tc_shared(conf, &sh);
    assert_int_equal(sh.syncfs_calls, 2);     /* failed before any round */
    assert_int_equal(sh.commits, 4);
    commit_batch_free(&b);

    /* a NULL configuration is "file" */
    assert_int_equal(commit_batch_new(NULL, &b), STORE_OK);
    assert_int_equal(commit_batch_add_fd(b, fd1), STORE_OK);
    assert_int_equal(commit_batch_add_dir(b, sub), STORE_OK);
    commit_stats_get(&s0);
    assert_int_equal(commit_batch_sync(b), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.file_syncs - s0.file_syncs, 1);
    assert_int_equal(s1.dir_syncs - s0.dir_syncs, 1);
    assert_int_equal(s1.rounds_led - s0.rounds_led, 0);
    commit_batch_free(&b);

    close(fd1);
    close(fd2);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
    free(sub);
    free(sub2);
    free(missing);
}

/* ---- 8 processes at once -------------------------------------------------- */

struct tc_report {
    int bad;                 /* commits that did not return STORE_OK */
    int early;               /* commits that returned before a round that
                                began after the call had finished */
    unsigned long led, joined;
};

static void tc_concurrent_child(const struct imapconf *conf, const char *spool,
                                int proc, int barrier, int report)
{
    struct tc_report rep = { 0, 0, 0, 0 };
    struct commit_shared_stats a, z;
    struct commit_stats s0, s1;
    char name[64], sub[64];
    char *dir;
    char c;
    int i, r;

    tc_child_start();
    snprintf(sub, sizeof(sub), "p%d", proc);
    dir = th_path(spool, sub);
    if (mkdir(dir, 0755) < 0 || read(barrier, &c, 1) < 0)
        _exit(3);
    commit_stats_get(&s0);
    for (i = 0; i < TC_COMMITS; i++) {
        snprintf(name, sizeof(name), "m%d", i);
        /* all writes of this commit happen in tc_commit_one before the
         * call; reading `started` here, after them, is earlier still than
         * the arrival inside the call */
        if (commit_shared_stats(conf, &a) != STORE_OK)
            _exit(4);
        r = tc_commit_one(conf, dir, name);
        if (commit_shared_stats(conf, &z) != STORE_OK)
            _exit(4);
        if (r != STORE_OK)
            rep.bad++;
        if (z.rounds_done < a.rounds_started + 1)
            rep.early++;
    }
    commit_stats_get(&s1);
    rep.led = s1.rounds_led - s0.rounds_led;
    rep.joined = s1.rounds_joined - s0.rounds_joined;
    if (write(report, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        _exit(5);
    _exit(0);
}

static void test_group_concurrent(void **state)
{
    char *dir = th_mkdtemp("commit-conc"), *spool;
    struct imapconf *conf;
    struct commit_shared_stats sh0, sh1;
    struct tc_report rep;
    pid_t pids[TC_PROCS];
    int barrier[2], report[2], i, status;
    unsigned long led = 0, joined = 0;
    unsigned long long commits, rounds;
    double t0, t1;
    char buf[64];

    (void)state;
    conf = th_store_conf(dir, "flat", "spool_sync: group\n");
    spool = th_path(dir, "spool");
    /* one commit so that the shared file exists before the children */
    assert_int_equal(tc_commit_one(conf, spool, "first"), STORE_OK);
    tc_shared(conf, &sh0);
    assert_int_equal(pipe(barrier), 0);
    assert_int_equal(pipe(report), 0);
    for (i = 0; i < TC_PROCS; i++) {
        pids[i] = fork();
        assert_true(pids[i] >= 0);
        if (pids[i] == 0) {
            close(barrier[1]);
            close(report[0]);
            tc_concurrent_child(conf, spool, i, barrier[0], report[1]);
        }
    }
    close(barrier[0]);
    close(report[1]);
    usleep(100000);
    t0 = th_now();
    close(barrier[1]);          /* go */
    for (i = 0; i < TC_PROCS; i++) {
        status = tc_wait(pids[i], 60);
        if (status < 0)
            tc_kill(pids[i]);
        assert_true(status >= 0);
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            fail_msg("child %d: %s", i, th_status_text(status, buf, sizeof(buf)));
    }
    t1 = th_now();
    for (i = 0; i < TC_PROCS; i++) {
        assert_int_equal(read(report[0], &rep, sizeof(rep)), (ssize_t)sizeof(rep));
        assert_int_equal(rep.bad, 0);
        assert_int_equal(rep.early, 0);
        led += rep.led;
        joined += rep.joined;
    }
    close(report[0]);
    tc_shared(conf, &sh1);
    commits = sh1.commits - sh0.commits;
    rounds = sh1.syncfs_calls - sh0.syncfs_calls;
    assert_int_equal(commits, TC_PROCS * TC_COMMITS);
    assert_int_equal(led, rounds);               /* every round had a leader */
    assert_int_equal(led + joined, commits);     /* each commit led or joined */
    assert_true(rounds < commits);
    assert_int_equal(sh1.rounds_started, sh1.rounds_done);
    assert_int_equal(sh1.rounds_failed + sh1.rounds_abandoned, 0);
    assert_int_equal(sh1.file_syncs + sh1.dir_syncs + sh1.fallbacks, 0);
    printf("# group commit: %d processes x %d commits: %llu commits, %llu "
           "syncfs rounds, %.2f commits per round, %.0f commits/s\n",
           TC_PROCS, TC_COMMITS, commits, rounds,
           (double)commits / (double)rounds, (double)commits / (t1 - t0));

    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
}

/* ---- deaths --------------------------------------------------------------- */

static int tc_hook_fd = -1, tc_hook_go = -1;

/* Tell the test we are leading, then hang until killed. */
static int tc_hook_hang(void *arg)
{
    (void)arg;
    if (write(tc_hook_fd, "L", 1) != 1)
        _exit(6);
    for (;;)
        pause();
    return 0;
}

static void tc_hook_hang_locked(void *arg)
{
    (void)tc_hook_hang(arg);
}

/* Tell the test, once, that this committer sleeps on another's round. */
static void tc_hook_waiting(void *arg)
{
    static int told;

    (void)arg;
    if (!told++ && write(tc_hook_fd, "W", 1) != 1)
        _exit(6);
}

/* Wait until n committers told they sleep on another's round. */
static void tc_wait_waiting(int fd, int n)
{
    int i;

    for (i = 0; i < n; i++)
        if (!tc_read_byte(fd, TC_EVENT_S))
            fail_msg("only %d of %d committers waiting on the round after "
                     "%.0f s", i, n, TC_EVENT_S);
}

/* Tell the test we are leading, wait for its go, sync for real. */
static int tc_hook_wait_go(void *arg)
{
    char c;

    (void)arg;
    if (write(tc_hook_fd, "L", 1) != 1 || read(tc_hook_go, &c, 1) != 1)
        _exit(6);
    return 0;
}

static int tc_hook_enospc(void *arg)
{
    (void)arg;
    return ENOSPC;
}

/* A committer child: exit 0 when its commit returns `want`, 2 if not. */
static pid_t tc_committer(const struct imapconf *conf, const char *dir,
                          const char *name, const struct commit_test_hooks *h,
                          int want)
{
    pid_t pid = fork();

    assert_true(pid >= 0);
    if (pid == 0) {
        tc_child_start();
        if (h)
            commit_test_set_hooks(h);
        _exit(tc_commit_one(conf, dir, name) == want ? 0 : 2);
    }
    return pid;
}

static void test_group_leader_killed(void **state)
{
    char *dir = th_mkdtemp("commit-kill"), *spool, name[32];
    struct imapconf *conf;
    struct commit_shared_stats sh0, sh1;
    struct commit_test_hooks hang = { .before_syncfs = tc_hook_hang };
    struct commit_test_hooks follow = { .waiting = tc_hook_waiting };
    pid_t leader, f[TC_FOLLOWERS];
    int pfd[2], i, status;
    double t0, t1;

    (void)state;
    conf = th_store_conf(dir, "flat", "spool_sync: group\n");
    spool = th_path(dir, "spool");
    assert_int_equal(tc_commit_one(conf, spool, "first"), STORE_OK);
    tc_shared(conf, &sh0);
    assert_int_equal(pipe(pfd), 0);
    tc_hook_fd = pfd[1];
    leader = tc_committer(conf, spool, "leader", &hang, STORE_OK);
    assert_true(tc_read_byte(pfd[0], TC_EVENT_S));   /* it leads, round open */
    for (i = 0; i < TC_FOLLOWERS; i++) {
        snprintf(name, sizeof(name), "f%d", i);
        f[i] = tc_committer(conf, spool, name, &follow, STORE_OK);
    }
    tc_wait_waiting(pfd[0], TC_FOLLOWERS);
    /* the followers wait for the hanging leader's round */
    for (i = 0; i < TC_FOLLOWERS; i++)
        assert_int_equal(waitpid(f[i], &status, WNOHANG), 0);
    t0 = th_now();
    tc_kill(leader);
    for (i = 0; i < TC_FOLLOWERS; i++) {
        status = tc_wait(f[i], TC_BOUND);
        if (status < 0)
            tc_kill(f[i]);
        assert_true(status >= 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    t1 = th_now();
    printf("# followers finished %.3f s after the leader was killed\n", t1 - t0);
    tc_shared(conf, &sh1);
    assert_int_equal(sh1.rounds_abandoned - sh0.rounds_abandoned, 1);
    assert_int_equal(sh1.rounds_started, sh1.rounds_done);
    /* the followers' commits were made by ONE round after the abandoned
     * one (the dead leader never reached syncfs()) */
    assert_int_equal(sh1.rounds_done - sh0.rounds_done, 2);
    assert_int_equal(sh1.syncfs_calls - sh0.syncfs_calls, 1);
    assert_int_equal(sh1.rounds_failed, 0);
    /* and the state serves the next commit */
    assert_int_equal(tc_commit_one(conf, spool, "after"), STORE_OK);
    close(pfd[0]);
    close(pfd[1]);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
}

static void test_group_owner_dead(void **state)
{
    char *dir = th_mkdtemp("commit-owner"), *spool;
    struct imapconf *conf;
    struct commit_shared_stats sh0, sh1;
    struct commit_test_hooks hang = { .locked = tc_hook_hang_locked };
    pid_t holder, next;
    int pfd[2], status;

    (void)state;
    conf = th_store_conf(dir, "flat", "spool_sync: group\n");
    spool = th_path(dir, "spool");
    assert_int_equal(tc_commit_one(conf, spool, "first"), STORE_OK);
    tc_shared(conf, &sh0);
    assert_int_equal(pipe(pfd), 0);
    tc_hook_fd = pfd[1];
    holder = tc_committer(conf, spool, "holder", &hang, STORE_OK);
    assert_true(tc_read_byte(pfd[0], TC_EVENT_S));   /* it holds the mutex */
    next = tc_committer(conf, spool, "next", NULL, STORE_OK);
    usleep(200000);     /* give it a chance to block (not needed to pass) */
    assert_int_equal(waitpid(next, &status, WNOHANG), 0);   /* blocked */
    tc_kill(holder);
    status = tc_wait(next, TC_BOUND);
    if (status < 0)
        tc_kill(next);
    assert_true(status >= 0);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    tc_shared(conf, &sh1);
    assert_int_equal(sh1.repairs - sh0.repairs, 1);
    assert_int_equal(sh1.rounds_started, sh1.rounds_done);
    /* the mutex is consistent again: this process commits normally */
    assert_int_equal(tc_commit_one(conf, spool, "after"), STORE_OK);
    tc_shared(conf, &sh0);
    assert_int_equal(sh0.repairs, sh1.repairs);
    close(pfd[0]);
    close(pfd[1]);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
}

static void test_group_round_fails(void **state)
{
    char *dir = th_mkdtemp("commit-fail"), *spool, name[32];
    struct imapconf *conf;
    struct commit_shared_stats sh0, sh1;
    struct commit_test_hooks wait_go = { .before_syncfs = tc_hook_wait_go };
    struct commit_test_hooks enospc = { .before_syncfs = tc_hook_enospc,
                                        .waiting = tc_hook_waiting };
    pid_t leader, f[TC_FOLLOWERS];
    int pfd[2], gfd[2], i, status;

    (void)state;
    conf = th_store_conf(dir, "flat", "spool_sync: group\n");
    spool = th_path(dir, "spool");
    assert_int_equal(tc_commit_one(conf, spool, "first"), STORE_OK);
    tc_shared(conf, &sh0);
    assert_int_equal(pipe(pfd), 0);
    assert_int_equal(pipe(gfd), 0);
    tc_hook_fd = pfd[1];
    tc_hook_go = gfd[0];
    /* round R: a leader that syncs for real once told to */
    leader = tc_committer(conf, spool, "leader", &wait_go, STORE_OK);
    assert_true(tc_read_byte(pfd[0], TC_EVENT_S));
    /* arriving during R they all need round R+1, whose leader (one of
     * them) "fails" with ENOSPC */
    for (i = 0; i < TC_FOLLOWERS; i++) {
        snprintf(name, sizeof(name), "f%d", i);
        f[i] = tc_committer(conf, spool, name, &enospc, STORE_NOSPACE);
    }
    tc_wait_waiting(pfd[0], TC_FOLLOWERS);
    for (i = 0; i < TC_FOLLOWERS; i++)
        assert_int_equal(waitpid(f[i], &status, WNOHANG), 0);
    assert_int_equal(write(gfd[1], "g", 1), 1);
    status = tc_wait(leader, TC_EVENT_S);
    assert_true(status >= 0 && WIFEXITED(status) && WEXITSTATUS(status) == 0);
    for (i = 0; i < TC_FOLLOWERS; i++) {
        status = tc_wait(f[i], TC_EVENT_S);
        if (status < 0)
            tc_kill(f[i]);
        assert_true(status >= 0);
        assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    tc_shared(conf, &sh1);
    /* one failed round failed all three */
    assert_int_equal(sh1.rounds_failed - sh0.rounds_failed, 1);
    assert_int_equal(sh1.rounds_done - sh0.rounds_done, 2);
    /* a later round is not affected */
    assert_int_equal(tc_commit_one(conf, spool, "after"), STORE_OK);
    close(pfd[0]);
    close(pfd[1]);
    close(gfd[0]);
    close(gfd[1]);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
}

/* ---- the shared file damaged ---------------------------------------------- */

static void tc_write_bytes(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);

    assert_true(fd >= 0);
    assert_int_equal(write(fd, data, len), (ssize_t)len);
    close(fd);
}

static void *tc_read_all(const char *path, size_t *len_r)
{
    struct stat st;
    void *p;
    int fd = open(path, O_RDONLY);

    assert_true(fd >= 0);
    assert_int_equal(fstat(fd, &st), 0);
    p = malloc((size_t)st.st_size);
    assert_non_null(p);
    assert_int_equal(read(fd, p, (size_t)st.st_size), st.st_size);
    close(fd);
    *len_r = (size_t)st.st_size;
    return p;
}

/* A store fixture whose commit.shm holds `data` before the first commit:
 * commit_shared_stats says `refused`, a commit replaces the file. */
static void tc_damaged(const void *data, size_t len, int refused)
{
    char *dir = th_mkdtemp("commit-damaged"), *spool, *confdir, *shm;
    struct imapconf *conf;
    struct commit_shared_stats sh;
    struct stat st;

    conf = th_store_conf(dir, "flat", "spool_sync: group\n");
    spool = th_path(dir, "spool");
    confdir = th_path(dir, "conf");
    shm = th_path(confdir, "commit.shm");
    tc_write_bytes(shm, data, len);
    assert_int_equal(commit_shared_stats(conf, &sh), refused);
    assert_int_equal(tc_commit_one(conf, spool, "m"), STORE_OK);
    assert_int_equal(stat(shm, &st), 0);
    assert_true(st.st_size > 0);
    tc_shared(conf, &sh);
    assert_int_equal(sh.commits, 1);        /* a fresh file */
    assert_int_equal(sh.syncfs_calls, 1);
    assert_int_equal(sh.fallbacks, 0);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
    free(confdir);
    free(shm);
}

static void test_damaged_shm(void **state)
{
    char *dir = th_mkdtemp("commit-good"), *spool, *shm;
    struct imapconf *conf;
    struct commit_shared_stats sh;
    unsigned char *good, *bad;
    size_t len;

    (void)state;
    /* a valid file with two commits counted, as a model */
    conf = th_store_conf(dir, "flat", "spool_sync: group\n");
    spool = th_path(dir, "spool");
    shm = th_path(dir, "conf/commit.shm");
    assert_int_equal(tc_commit_one(conf, spool, "a"), STORE_OK);
    assert_int_equal(tc_commit_one(conf, spool, "b"), STORE_OK);
    tc_shared(conf, &sh);
    assert_int_equal(sh.commits, 2);
    good = tc_read_all(shm, &len);
    assert_true(len > 100);

    /* short */
    tc_damaged(good, 100, STORE_CORRUPT);
    /* right size, garbage */
    bad = malloc(len);
    assert_non_null(bad);
    memset(bad, 0xab, len);
    tc_damaged(bad, len, STORE_CORRUPT);
    /* longer than it should be */
    free(bad);
    bad = calloc(1, len + 4096);
    assert_non_null(bad);
    memcpy(bad, good, len);
    tc_damaged(bad, len + 4096, STORE_CORRUPT);
    /* from an earlier boot: another boot id (offset 16) */
    memcpy(bad, good, len);
    memcpy(bad + 16, "00000000-0000-0000-0000-000000000000", 36);
    tc_damaged(bad, len, STORE_NOTFOUND);

    free(bad);
    free(good);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
    free(shm);
}

/* ---- no place for the shared file ---------------------------------------- */

static void tc_fallback(const char *extra, int stats_code)
{
    char *dir = th_mkdtemp("commit-fallback"), *spool;
    struct imapconf *conf;
    struct commit_stats s0, s1;
    struct commit_shared_stats sh;

    conf = th_store_conf(dir, "flat", extra);
    spool = th_path(dir, "spool");
    commit_stats_get(&s0);
    assert_int_equal(tc_commit_one(conf, spool, "a"), STORE_OK);
    assert_int_equal(tc_commit_one(conf, spool, "b"), STORE_OK);
    commit_stats_get(&s1);
    assert_int_equal(s1.fallbacks - s0.fallbacks, 2);
    assert_int_equal(s1.file_syncs - s0.file_syncs, 2);   /* the file way */
    assert_int_equal(s1.dir_syncs - s0.dir_syncs, 2);
    assert_int_equal(s1.rounds_led - s0.rounds_led, 0);
    assert_int_equal(commit_shared_stats(conf, &sh), stats_code);
    imapconf_free(&conf);
    th_rmrf(dir);
    free(dir);
    free(spool);
}

static void test_fallback(void **state)
{
    char *dir = th_mkdtemp("commit-nodir"), *file, extra[4200];
    int fd;

    (void)state;
    /* configdirectory missing */
    snprintf(extra, sizeof(extra), "spool_sync: group\nconfigdirectory: %s/missing/conf\n", dir);
    tc_fallback(extra, STORE_NOTFOUND);
    /* configdirectory a regular file */
    file = th_path(dir, "file");
    fd = open(file, O_WRONLY | O_CREAT, 0600);
    assert_true(fd >= 0);
    close(fd);
    snprintf(extra, sizeof(extra), "spool_sync: group\nconfigdirectory: %s\n", file);
    tc_fallback(extra, STORE_IOERROR);
    /* configdirectory not writable (root may write anyway) */
    if (geteuid() != 0) {
        char *ro = th_path(dir, "ro");

        assert_int_equal(mkdir(ro, 0555), 0);
        snprintf(extra, sizeof(extra), "spool_sync: group\nconfigdirectory: %s\n", ro);
        tc_fallback(extra, STORE_NOTFOUND);
        chmod(ro, 0755);
        free(ro);
    }
    th_rmrf(dir);
    free(dir);
    free(file);
}

int main(void)
{
    static const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mode_file),
        cmocka_unit_test(test_mode_off),
        cmocka_unit_test(test_mode_group),
        cmocka_unit_test(test_group_concurrent),
        cmocka_unit_test(test_group_leader_killed),
        cmocka_unit_test(test_group_owner_dead),
        cmocka_unit_test(test_group_round_fails),
        cmocka_unit_test(test_damaged_shm),
        cmocka_unit_test(test_fallback),
    };

    log_init("test_commit", getenv("TEST_LOG") ? LOG_TO_STDERR : LOG_TO_NONE);
    return cmocka_run_group_tests_name("commit", tests, NULL, NULL);
}
