/*
 * dbbench.c - measure the cyrusdb backends against each other.
 *
 *   dbbench [-b LIST] [-n OPS] [-s SIZE] [-k KEYS] [-r RUNS] [-d DIR] [--markdown]
 *
 * A benchmark, not a test: it prints a table of operations per second for
 * each backend and each workload, run by 1 and by 8 processes at once
 * (fork()ed, each with its own handle, all on one database file), the
 * median of several runs.  Workloads, on a database preloaded with KEYS
 * records:
 *   store 1/txn    random stores, each its own (durable) transaction
 *   store 100/txn  random stores, 100 per transaction
 *   fetch          random fetches of present keys
 *   walk           prefix walks (foreach) over about 100 records each
 * Only the workload itself is timed: every child opens its handle, then all
 * wait at a barrier (a pipe the parent closes) and the clock runs from the
 * barrier until the last child has exited.  Each run uses a fresh database
 * in a fresh directory, removed afterwards.
 *
 * flat rewrites its whole file on each commit, so its operation counts are
 * divided by DBBENCH_FLAT_SCALE; the table says so.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/vfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/log.h"

#define DBBENCH_EXIT_OK 0
#define DBBENCH_EXIT_ERROR 1
#define DBBENCH_EXIT_USAGE 2

#define DBBENCH_FLAT_SCALE 10
#define DBBENCH_MAX_PROCS 64
#define DBBENCH_MAX_BACKENDS 16
#define DBBENCH_MAX_RUNS 99
#define DBBENCH_PRELOAD_TXN 1000
#define DBBENCH_WALK_SPAN 100      /* keys share a prefix in groups of 100 */
#define DBBENCH_DEFAULT_DIR "/var/tmp"

static const char *dbbench_progname = "dbbench";

enum dbbench_work {
    DBBENCH_STORE1 = 0,
    DBBENCH_STORE100,
    DBBENCH_FETCH,
    DBBENCH_WALK,
    DBBENCH_NWORK
};

static const struct {
    const char *title;
    unsigned mult;       /* operations = mult * -n */
} dbbench_works[DBBENCH_NWORK] = {
    [DBBENCH_STORE1]   = { .title = "store 1/txn",   .mult = 1 },
    [DBBENCH_STORE100] = { .title = "store 100/txn", .mult = 10 },
    [DBBENCH_FETCH]    = { .title = "fetch",         .mult = 50 },
    [DBBENCH_WALK]     = { .title = "prefix walk",   .mult = 1 },
};

struct dbbench_opts {
    const char *backends[DBBENCH_MAX_BACKENDS];
    int nbackends;
    unsigned procs[2];
    unsigned long ops;        /* -n */
    size_t valsize;           /* -s */
    unsigned long keys;       /* -k */
    int runs;                 /* -r */
    const char *basedir;      /* -d */
    int markdown;
    int quiet;
};

static void dbbench_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-b LIST] [-n OPS] [-s SIZE] [-k KEYS] [-r RUNS] [-d DIR]\n"
"               [-m | --markdown] [-q]\n"
"\n"
"Benchmark the cyrusdb backends.  For each backend, on a database preloaded\n"
"with KEYS records, times four workloads, each by 1 and by 8 processes at\n"
"once on the same file, and prints operations per second (median of RUNS):\n"
"  store 1/txn    OPS random stores, each in its own durable transaction\n"
"  store 100/txn  10 x OPS random stores, 100 per transaction\n"
"  fetch          50 x OPS random fetches\n"
"  prefix walk    OPS prefix walks of about 100 records each\n"
"The operations are shared out among the processes.  flat rewrites its\n"
"whole file at each commit: its counts are divided by %d.\n"
"\n"
"Options:\n"
"  -b LIST   backends, comma- or space-separated (default: every backend:\n"
"            %s)\n"
"  -n OPS    base operation count (default 1000)\n"
"  -s SIZE   value size in bytes (default 100)\n"
"  -k KEYS   records preloaded; keys are \"user.%%08lu\" (default 10000)\n"
"  -r RUNS   runs per cell; the median is shown (default 3)\n"
"  -d DIR    where to make the temporary directory (default %s, on disk:\n"
"            a tmpfs gives meaningless fsync times); it is removed after\n"
"  -m, --markdown  print the table in Markdown\n"
"  -q        no progress messages on stderr\n"
"  -h, --help  this text\n"
"\n"
"Exit status: 0 done, 1 a backend failed (its cells show ERR), 2 usage.\n"
"Example: %s -b skiplist,lmdb -n 200 -r 1\n",
            dbbench_progname, DBBENCH_FLAT_SCALE, "flat skiplist db3 db3-nosync lmdb",
            DBBENCH_DEFAULT_DIR, dbbench_progname);
}

static void dbbench_usage_error(const char *what, const char *arg)
{
    fprintf(stderr, "%s: %s%s%s\nTry '%s --help' for more information.\n",
            dbbench_progname, what, arg ? ": " : "", arg ? arg : "",
            dbbench_progname);
    exit(DBBENCH_EXIT_USAGE);
}

static unsigned long dbbench_number(const char *s, unsigned long min,
                                    unsigned long max, const char *what)
{
    char *end;
    unsigned long v;

    errno = 0;
    v = strtoul(s, &end, 10);
    if (errno || end == s || *end || s[0] == '-' || v < min || v > max)
        dbbench_usage_error(what, s);
    return v;
}

static double dbbench_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* xorshift64*: a fast generator, seeded per child */
static uint64_t dbbench_rand(uint64_t *state)
{
    uint64_t x = *state;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *state = x;
    return x * 0x2545F4914F6CDD1DULL;
}

static size_t dbbench_key(char *out, size_t outlen, unsigned long n)
{
    int w = snprintf(out, outlen, "user.%08lu", n);
    return w > 0 ? (size_t)w : 0;
}

/* ---- the workloads, run in a child ---------------------------------------- */

struct dbbench_walk {
    unsigned long records;
};

static int dbbench_walk_cb(void *rock, const char *key, size_t keylen,
                           const char *data, size_t datalen)
{
    struct dbbench_walk *w = rock;

    (void)key; (void)keylen; (void)data; (void)datalen;
    w->records++;
    return 0;
}

/* Store `count` random records in transactions of `pertxn` (0: tid NULL).
 * A transaction that meets CYRUSDB_AGAIN is aborted and done again. */
static int dbbench_stores(struct cyrusdb *db, const struct dbbench_opts *o,
                          unsigned long count, unsigned pertxn, uint64_t *rng,
                          char *val)
{
    char key[64];
    unsigned long done = 0;

    while (done < count) {
        unsigned long batch = pertxn ? pertxn : 1;
        uint64_t saved = *rng;
        struct cyrusdb_txn *tid = NULL;
        unsigned long i;
        int r = CYRUSDB_OK;

        if (batch > count - done)
            batch = count - done;
        for (i = 0; i < batch && r == CYRUSDB_OK; i++) {
            uint64_t x = dbbench_rand(rng);
            size_t kl = dbbench_key(key, sizeof(key), (unsigned long)(x % o->keys));
            if (o->valsize)
                val[0] = (char)('a' + x % 26);
            r = cyrusdb_store(db, key, kl, val, o->valsize, pertxn ? &tid : NULL);
        }
        if (r == CYRUSDB_OK && tid)
            r = cyrusdb_commit(db, tid);
        else if (tid)
            cyrusdb_abort(db, tid);
        if (r == CYRUSDB_AGAIN) {
            *rng = saved;        /* same keys again */
            continue;
        }
        if (r != CYRUSDB_OK) {
            log_error("dbbench: store failed error=<%s>", cyrusdb_strerror(r));
            return -1;
        }
        done += batch;
    }
    return 0;
}

static int dbbench_child_work(struct cyrusdb *db, const struct dbbench_opts *o,
                              enum dbbench_work work, unsigned long count,
                              uint64_t *rng, char *val)
{
    char key[64];
    unsigned long i;
    int r;

    switch (work) {
    case DBBENCH_STORE1:
        return dbbench_stores(db, o, count, 0, rng, val);
    case DBBENCH_STORE100:
        return dbbench_stores(db, o, count, 100, rng, val);
    case DBBENCH_FETCH:
        for (i = 0; i < count; i++) {
            const char *data;
            size_t datalen;
            size_t kl = dbbench_key(key, sizeof(key),
                                    (unsigned long)(dbbench_rand(rng) % o->keys));
            do {
                r = cyrusdb_fetch(db, key, kl, &data, &datalen, NULL);
            } while (r == CYRUSDB_AGAIN);
            if (r != CYRUSDB_OK || datalen != o->valsize) {
                log_error("dbbench: fetch failed key=<%s> error=<%s>", key,
                          r ? cyrusdb_strerror(r) : "wrong value size");
                return -1;
            }
        }
        return 0;
    case DBBENCH_WALK:
        for (i = 0; i < count; i++) {
            struct dbbench_walk w = { 0 };
            unsigned long groups = (o->keys + DBBENCH_WALK_SPAN - 1) / DBBENCH_WALK_SPAN;
            size_t kl = dbbench_key(key, sizeof(key),
                                    (unsigned long)(dbbench_rand(rng) % groups) *
                                    DBBENCH_WALK_SPAN);
            kl -= 2;   /* "user.000123" + "xx" */
            do {
                w.records = 0;
                r = cyrusdb_foreach(db, key, kl, NULL, dbbench_walk_cb, &w, NULL);
            } while (r == CYRUSDB_AGAIN);
            if (r != CYRUSDB_OK || w.records == 0) {
                log_error("dbbench: walk failed prefix=<%.*s> error=<%s>",
                          (int)kl, key, r ? cyrusdb_strerror(r) : "no records");
                return -1;
            }
        }
        return 0;
    case DBBENCH_NWORK:
        break;
    }
    return -1;
}

/* ---- one timed cell ------------------------------------------------------ */

/*
 * Run `work` with `procs` processes on `fname`; each does `per` operations.
 * Returns the elapsed seconds, or a negative number on failure.
 */
static double dbbench_cell(const struct dbbench_opts *o, const char *backend,
                           const char *fname, enum dbbench_work work,
                           unsigned procs, unsigned long per, uint64_t seed)
{
    pid_t pids[DBBENCH_MAX_PROCS];
    int ready[2], go[2];
    unsigned i, started = 0, ok = 0;
    int failed = 0;
    double t0, t1;
    char c;

    if (pipe(ready) < 0 || pipe(go) < 0) {
        log_error("dbbench: pipe failed error=<%s>", strerror(errno));
        return -1;
    }
    fflush(stdout);
    fflush(stderr);
    for (i = 0; i < procs; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            log_error("dbbench: fork failed error=<%s>", strerror(errno));
            failed = 1;
            break;
        }
        if (pid == 0) {
            struct cyrusdb *db = NULL;
            const char *err = NULL;
            uint64_t rng = seed * 1000003ULL + i * 7919ULL + 1;
            char *val = malloc(o->valsize ? o->valsize : 1);
            int r;

            signal(SIGINT, SIG_DFL);
            signal(SIGTERM, SIG_DFL);
            close(ready[0]);
            close(go[1]);
            if (!val)
                _exit(1);
            memset(val, 'v', o->valsize);
            r = cyrusdb_open(backend, fname, 0, &db, &err);
            c = r == CYRUSDB_OK ? 'R' : 'E';
            if (write(ready[1], &c, 1) != 1)
                _exit(1);
            close(ready[1]);
            if (r != CYRUSDB_OK)
                _exit(1);
            /* the barrier: read returns 0 when the parent closes go[1] */
            while (read(go[0], &c, 1) < 0 && errno == EINTR)
                ;
            r = dbbench_child_work(db, o, work, per, &rng, val) < 0;
            if (cyrusdb_close(&db) != CYRUSDB_OK)
                r = 1;
            free(val);
            _exit(r ? 1 : 0);
        }
        pids[started++] = pid;
    }
    close(ready[1]);
    close(go[0]);
    for (i = 0; i < started; i++) {
        ssize_t n;
        do {
            n = read(ready[0], &c, 1);
        } while (n < 0 && errno == EINTR);
        if (n != 1 || c != 'R') {
            failed = 1;
            break;
        }
    }
    close(ready[0]);
    t0 = dbbench_now();
    close(go[1]);
    for (i = 0; i < started; i++) {
        int status;
        while (waitpid(pids[i], &status, 0) < 0 && errno == EINTR)
            ;
        if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
            ok++;
    }
    t1 = dbbench_now();
    if (failed || ok != procs)
        return -1;
    return t1 - t0 > 1e-9 ? t1 - t0 : 1e-9;
}

/* ---- directories ------------------------------------------------------- */

static int dbbench_rm_cb(const char *path, const struct stat *st, int flag,
                         struct FTW *ftw)
{
    (void)st; (void)flag; (void)ftw;
    if (remove(path) < 0)
        log_warning("dbbench: cannot remove path=<%s> error=<%s>", path,
                    strerror(errno));
    return 0;
}

static void dbbench_rmrf(const char *path)
{
    nftw(path, dbbench_rm_cb, 16, FTW_DEPTH | FTW_PHYS);
}

static char *dbbench_tmpdir_path;

static void dbbench_on_signal(int sig)
{
    /* remove what we made, then die of the same signal */
    if (dbbench_tmpdir_path)
        dbbench_rmrf(dbbench_tmpdir_path);
    signal(sig, SIG_DFL);
    raise(sig);
}

/* Preload `keys` records in transactions of DBBENCH_PRELOAD_TXN. */
static int dbbench_preload(const struct dbbench_opts *o, const char *backend,
                           const char *fname)
{
    struct cyrusdb *db = NULL;
    const char *err = NULL;
    char key[64];
    char *val;
    unsigned long n = 0;
    int r;

    r = cyrusdb_open(backend, fname, CYRUSDB_CREATE, &db, &err);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "%s: %s\n", dbbench_progname, err && *err ? err : cyrusdb_strerror(r));
        return -1;
    }
    val = malloc(o->valsize ? o->valsize : 1);
    if (!val) {
        cyrusdb_close(&db);
        return -1;
    }
    memset(val, 'p', o->valsize);
    while (n < o->keys && r == CYRUSDB_OK) {
        struct cyrusdb_txn *tid = NULL;
        unsigned long end = n + DBBENCH_PRELOAD_TXN < o->keys ? n + DBBENCH_PRELOAD_TXN : o->keys;
        for (; n < end && r == CYRUSDB_OK; n++)
            r = cyrusdb_store(db, key, dbbench_key(key, sizeof(key), n), val,
                              o->valsize, &tid);
        if (r == CYRUSDB_OK && tid)
            r = cyrusdb_commit(db, tid);
        else if (tid)
            cyrusdb_abort(db, tid);
    }
    free(val);
    if (r != CYRUSDB_OK)
        fprintf(stderr, "%s: %s: preload failed: %s\n", dbbench_progname,
                fname, cyrusdb_strerror(r));
    if (cyrusdb_close(&db) != CYRUSDB_OK && r == CYRUSDB_OK)
        r = CYRUSDB_IOERROR;
    return r == CYRUSDB_OK ? 0 : -1;
}

/* ---- output ------------------------------------------------------------ */

static int dbbench_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double dbbench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), dbbench_cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void dbbench_machine(const struct dbbench_opts *o, const char *dir)
{
    struct utsname u;
    struct statfs sfs;
    char model[256] = "";
    FILE *f = fopen("/proc/cpuinfo", "r");
    const char *fstype = "";

    if (f) {
        char line[512];
        while (fgets(line, sizeof(line), f)) {
            char *colon = strchr(line, ':');
            if (!strncmp(line, "model name", 10) && colon) {
                snprintf(model, sizeof(model), "%s", colon + 2);
                model[strcspn(model, "\n")] = '\0';
                break;
            }
        }
        fclose(f);
    }
    if (statfs(dir, &sfs) == 0) {
        if (sfs.f_type == 0x01021994)
            fstype = " (tmpfs: fsync costs nothing here)";
        else if (sfs.f_type == 0xEF53)
            fstype = " (ext2/3/4)";
        else if (sfs.f_type == 0x58465342)
            fstype = " (xfs)";
        else if (sfs.f_type == 0x9123683E)
            fstype = " (btrfs)";
    }
    if (uname(&u) < 0)
        memset(&u, 0, sizeof(u));
    printf("%smachine: nproc=%ld kernel=%s %s %s%s%s\n", o->markdown ? "- " : "",
           sysconf(_SC_NPROCESSORS_ONLN), u.sysname, u.release, u.machine,
           model[0] ? " cpu=" : "", model);
    printf("%sdirectory: %s%s\n", o->markdown ? "- " : "", dir, fstype);
    printf("%sworkload: %lu keys preloaded, values of %zu bytes, ops per cell: "
           "store 1/txn %lu, store 100/txn %lu, fetch %lu, prefix walk %lu "
           "(walks of ~%d records); ops/second, median of %d run%s\n",
           o->markdown ? "- " : "", o->keys, o->valsize,
           o->ops * dbbench_works[DBBENCH_STORE1].mult,
           o->ops * dbbench_works[DBBENCH_STORE100].mult,
           o->ops * dbbench_works[DBBENCH_FETCH].mult,
           o->ops * dbbench_works[DBBENCH_WALK].mult,
           DBBENCH_WALK_SPAN, o->runs, o->runs == 1 ? "" : "s");
    printf("\n");
}

static void dbbench_header(const struct dbbench_opts *o)
{
    int w, p;

    if (o->markdown) {
        printf("| backend |");
        for (w = 0; w < DBBENCH_NWORK; w++)
            for (p = 0; p < 2; p++)
                printf(" %s x%u |", dbbench_works[w].title, o->procs[p]);
        printf("\n|---|");
        for (w = 0; w < DBBENCH_NWORK * 2; w++)
            printf("---:|");
        printf("\n");
        return;
    }
    printf("%-12s", "backend");
    for (w = 0; w < DBBENCH_NWORK; w++)
        for (p = 0; p < 2; p++) {
            char t[64];
            snprintf(t, sizeof(t), "%s x%u", dbbench_works[w].title, o->procs[p]);
            printf(" %17s", t);
        }
    printf("\n");
}

static void dbbench_row(const struct dbbench_opts *o, const char *backend,
                        double rate[DBBENCH_NWORK][2])
{
    char name[32];
    int w, p;

    snprintf(name, sizeof(name), "%s%s", backend,
             !strcmp(backend, "flat") ? " *" : "");
    printf(o->markdown ? "| %s |" : "%-12s", name);
    for (w = 0; w < DBBENCH_NWORK; w++)
        for (p = 0; p < 2; p++) {
            char cell[32];
            if (rate[w][p] < 0)
                snprintf(cell, sizeof(cell), "ERR");
            else
                snprintf(cell, sizeof(cell), "%.0f", rate[w][p]);
            printf(o->markdown ? " %s |" : " %17s", cell);
        }
    printf("\n");
    fflush(stdout);
}

/* ---- main -------------------------------------------------------------- */

static int dbbench_backend(const struct dbbench_opts *o, const char *tmpdir,
                           const char *backend, double rate[DBBENCH_NWORK][2])
{
    double times[DBBENCH_NWORK][2][DBBENCH_MAX_RUNS];
    unsigned long scale = !strcmp(backend, "flat") ? DBBENCH_FLAT_SCALE : 1;
    struct buf dir = BUF_INITIALIZER, fname = BUF_INITIALIZER;
    int run, w, p, failed = 0;

    for (w = 0; w < DBBENCH_NWORK; w++)
        for (p = 0; p < 2; p++)
            rate[w][p] = 0;
    for (run = 0; run < o->runs; run++) {
        buf_reset(&dir);
        buf_printf(&dir, "%s/%s.%d", tmpdir, backend, run);
        buf_reset(&fname);
        buf_printf(&fname, "%s/bench.db", buf_cstring(&dir));
        if (mkdir(buf_cstring(&dir), 0700) < 0) {
            fprintf(stderr, "%s: %s: %s\n", dbbench_progname, buf_cstring(&dir),
                    strerror(errno));
            failed = 1;
            break;
        }
        if (!o->quiet)
            fprintf(stderr, "%s: %s: run %d of %d\n", dbbench_progname,
                    backend, run + 1, o->runs);
        if (dbbench_preload(o, backend, buf_cstring(&fname)) < 0) {
            failed = 1;
            dbbench_rmrf(buf_cstring(&dir));
            break;
        }
        for (w = 0; w < DBBENCH_NWORK; w++) {
            for (p = 0; p < 2; p++) {
                unsigned long total = o->ops * dbbench_works[w].mult / scale;
                unsigned long per = (total + o->procs[p] - 1) / o->procs[p];
                double t;

                if (per == 0)
                    per = 1;
                t = dbbench_cell(o, backend, buf_cstring(&fname),
                                 (enum dbbench_work)w, o->procs[p], per,
                                 (uint64_t)(run * 100 + w * 10 + p + 1));
                if (t < 0) {
                    fprintf(stderr, "%s: %s: %s with %u processes failed\n",
                            dbbench_progname, backend, dbbench_works[w].title,
                            o->procs[p]);
                    rate[w][p] = -1;
                    failed = 1;
                    times[w][p][run] = 0;
                } else {
                    times[w][p][run] = (double)(per * o->procs[p]) / t;
                }
            }
        }
        dbbench_rmrf(buf_cstring(&dir));
    }
    for (w = 0; w < DBBENCH_NWORK; w++)
        for (p = 0; p < 2; p++)
            if (rate[w][p] >= 0)
                rate[w][p] = run ? dbbench_median(times[w][p], run) : -1;
    buf_free(&dir);
    buf_free(&fname);
    return failed ? -1 : 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { "markdown", no_argument, NULL, 'm' },
        { NULL, 0, NULL, 0 }
    };
    static const char *const defaults[] = {
        "flat", "skiplist", "db3", "db3-nosync", "lmdb"
    };
    struct dbbench_opts o = {
        .nbackends = 0, .procs = { 1, 8 }, .ops = 1000, .valsize = 100,
        .keys = 10000, .runs = 3, .basedir = DBBENCH_DEFAULT_DIR,
        .markdown = 0, .quiet = 0
    };
    static char list[1024];
    struct buf tmpl = BUF_INITIALIZER;
    char *tmpdir;
    int opt, i, failed = 0;

    log_init(argv[0], LOG_TO_STDERR);
    if (argv[0])
        dbbench_progname = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];

    while ((opt = getopt_long(argc, argv, "b:n:s:k:r:d:mqh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'b': {
            char *tok, *save = NULL;
            snprintf(list, sizeof(list), "%s", optarg);
            o.nbackends = 0;
            for (tok = strtok_r(list, ", ", &save); tok;
                 tok = strtok_r(NULL, ", ", &save)) {
                if (!cyrusdb_lookup(tok)) {
                    fprintf(stderr, "%s: unknown backend \"%s\" (known: %s)\n",
                            dbbench_progname, tok, cyrusdb_names());
                    return DBBENCH_EXIT_USAGE;
                }
                if (o.nbackends == DBBENCH_MAX_BACKENDS)
                    dbbench_usage_error("too many backends", NULL);
                o.backends[o.nbackends++] = tok;
            }
            if (!o.nbackends)
                dbbench_usage_error("-b needs at least one backend", NULL);
            break;
        }
        case 'n': o.ops = dbbench_number(optarg, 1, 100000000, "bad -n (1 to 100000000)"); break;
        case 's': o.valsize = dbbench_number(optarg, 0, 1 << 20, "bad -s (0 to 1048576)"); break;
        case 'k': o.keys = dbbench_number(optarg, DBBENCH_WALK_SPAN, 100000000,
                                          "bad -k (100 to 100000000)"); break;
        case 'r': o.runs = (int)dbbench_number(optarg, 1, DBBENCH_MAX_RUNS, "bad -r (1 to 99)"); break;
        case 'd': o.basedir = optarg; break;
        case 'm': o.markdown = 1; break;
        case 'q': o.quiet = 1; break;
        case 'h': dbbench_usage(stdout); return DBBENCH_EXIT_OK;
        default:
            fprintf(stderr, "Try '%s --help' for more information.\n", dbbench_progname);
            return DBBENCH_EXIT_USAGE;
        }
    }
    if (optind != argc)
        dbbench_usage_error("unexpected argument", argv[optind]);
    if (!o.nbackends) {
        for (i = 0; i < (int)(sizeof(defaults) / sizeof(defaults[0])); i++)
            o.backends[o.nbackends++] = defaults[i];
    }

    buf_printf(&tmpl, "%s/dbbench.XXXXXX", o.basedir);
    tmpdir = buf_release(&tmpl);
    if (!tmpdir || !mkdtemp(tmpdir)) {
        fprintf(stderr, "%s: cannot make a directory in %s: %s\n",
                dbbench_progname, o.basedir, strerror(errno));
        free(tmpdir);
        return DBBENCH_EXIT_ERROR;
    }
    dbbench_tmpdir_path = tmpdir;
    signal(SIGINT, dbbench_on_signal);
    signal(SIGTERM, dbbench_on_signal);

    dbbench_machine(&o, tmpdir);
    dbbench_header(&o);
    fflush(stdout);
    for (i = 0; i < o.nbackends; i++) {
        double rate[DBBENCH_NWORK][2];
        if (dbbench_backend(&o, tmpdir, o.backends[i], rate) < 0)
            failed = 1;
        dbbench_row(&o, o.backends[i], rate);
    }
    for (i = 0; i < o.nbackends; i++)
        if (!strcmp(o.backends[i], "flat")) {
            printf("\n* flat: operation counts divided by %d (each commit "
                   "rewrites the whole file)\n", DBBENCH_FLAT_SCALE);
            break;
        }

    dbbench_tmpdir_path = NULL;
    dbbench_rmrf(tmpdir);
    free(tmpdir);
    return failed ? DBBENCH_EXIT_ERROR : DBBENCH_EXIT_OK;
}
