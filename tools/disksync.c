/*
 * disksync.c - the disk's own limit for durable mail delivery.
 *
 *   disksync [-d DIR] [-t SECONDS | -n COUNT] [-r RUNS] [-w LIST] [-a LIST]
 *            [-s BYTES] [-b BYTES] [-m MB] [-x TESTS] [-q]
 *
 * A benchmark, not a test.  What a mail store asks of the disk, measured
 * without any mail software in the way, so that a delivery rate can be
 * read against the ceiling the hardware sets:
 *
 *   create   new files of -s BYTES (default 13,870: the benchmark's message
 *            size), each open(O_CREAT|O_EXCL) + write + fsync + close, by
 *            each writer count of -w (default "1 4 16 100": fork()ed
 *            processes), once all in one shared directory and once each
 *            writer in its own directory (the queue-directory experiment:
 *            ext4 serializes creations in one directory)
 *   append   records of -b BYTES (default 512) appended + fdatasync, each
 *            writer on its own file, for each writer count of -a
 *            (default "1 16")
 *   seq      one writer, 1 MiB writes + fdatasync each, -m MB in total
 *            (default 256): synced sequential bandwidth
 *   syncfs   2,000 new files of -s BYTES written WITHOUT fsync, then one
 *            syncfs(): what one group commit of a whole storm costs
 *
 * Each cell runs RUNS times (default 3) in a fresh directory under
 * DIR (default /var/tmp, which must be the real disk, not tmpfs) and
 * reports the median rate, the range, and the p50/p99 latency of one
 * operation (create+write+fsync+close; append+fdatasync) taken from the
 * run with the median rate.  Writers start together from a barrier and
 * stop at a shared deadline (-t, default 3 s) or after COUNT operations
 * each (-n).  Output: a markdown table on stdout, progress on stderr.
 * Files are removed after each run (untimed); the scratch directory is
 * removed at the end, also on SIGINT/SIGTERM.
 *
 * Latencies are kept per writer in a shared histogram (10 us buckets up
 * to 1 s, then one overflow bucket), so no sample is lost whatever the
 * rate; percentiles are exact to the bucket width.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define DS_EXIT_OK 0
#define DS_EXIT_ERROR 1
#define DS_EXIT_USAGE 2

#define DS_MAX_WRITERS 1000
#define DS_MAX_RUNS 99
#define DS_HIST_US 10                       /* bucket width */
#define DS_HIST_BUCKETS (1000000 / DS_HIST_US + 1) /* last: >= 1 s */
#define DS_SEQ_CHUNK (1024 * 1024)
#define DS_SYNCFS_FILES 2000

/* What each writer reports back, in memory shared with the parent. */
struct ds_slot {
    uint64_t ops;
    int failed;                       /* errno of the first failure */
    char what[32];                    /* the call that failed */
    uint32_t hist[DS_HIST_BUCKETS];
};

struct ds_options {
    const char *dir;
    double seconds;
    long count;                       /* > 0: ops per writer instead of -t */
    int runs;
    int create_writers[32];
    int ncreate;
    int append_writers[32];
    int nappend;
    size_t file_bytes;
    size_t record_bytes;
    long seq_mb;
    int tests;                        /* DS_TEST_* bits */
    int quiet;
};

#define DS_TEST_CREATE 1
#define DS_TEST_APPEND 2
#define DS_TEST_SEQ 4
#define DS_TEST_SYNCFS 8

/* One measured run: a rate and, where it applies, latencies. */
struct ds_result {
    double rate;                      /* ops/s or MB/s */
    double p50_ms, p99_ms, max_ms;    /* < 0: not applicable */
};

static char ds_scratch[1024];         /* removed on exit */
static volatile sig_atomic_t ds_interrupted;

static double ds_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void ds_on_signal(int sig)
{
    (void)sig;
    ds_interrupted = 1;
}

static int ds_rm_one(const char *path, const struct stat *st, int flag,
                     struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    if (remove(path) != 0 && errno != ENOENT) {
        fprintf(stderr, "disksync: remove %s: %s\n", path, strerror(errno));
    }
    return 0;
}

static void ds_rmtree(const char *path)
{
    nftw(path, ds_rm_one, 64, FTW_DEPTH | FTW_PHYS);
}

static void ds_progress(const struct ds_options *o, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void ds_progress(const struct ds_options *o, const char *fmt, ...)
{
    va_list ap;

    if (o->quiet) return;
    va_start(ap, fmt);
    fputs("disksync: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

static void ds_hist_add(struct ds_slot *slot, double seconds)
{
    double us = seconds * 1e6;
    size_t b;

    if (us < 0) us = 0;
    b = (size_t)(us / DS_HIST_US);
    if (b >= DS_HIST_BUCKETS) b = DS_HIST_BUCKETS - 1;
    slot->hist[b]++;
}

static void ds_fail(struct ds_slot *slot, const char *what)
{
    if (!slot->failed) {
        slot->failed = errno ? errno : EIO;
        snprintf(slot->what, sizeof(slot->what), "%s", what);
    }
}

/* write() all of buf, retrying short writes and EINTR. */
static int ds_write_all(int fd, const char *buf, size_t len)
{
    while (len > 0) {
        ssize_t n = write(fd, buf, len);

        if (n < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        buf += n;
        len -= (size_t)n;
    }
    return 0;
}

/* The body of one create writer: files DIR/w<id>.<n>. */
static void ds_create_writer(const struct ds_options *o, const char *dir,
                             int id, double deadline, const char *data,
                             struct ds_slot *slot)
{
    char path[1300];
    long n;

    for (n = 0; o->count > 0 ? n < o->count : ds_now() < deadline; n++) {
        double t0 = ds_now();
        int fd;

        snprintf(path, sizeof(path), "%s/w%d.%ld", dir, id, n);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) { ds_fail(slot, "open"); return; }
        if (ds_write_all(fd, data, o->file_bytes) != 0) {
            ds_fail(slot, "write");
            close(fd);
            return;
        }
        if (fsync(fd) != 0) { ds_fail(slot, "fsync"); close(fd); return; }
        if (close(fd) != 0) { ds_fail(slot, "close"); return; }
        ds_hist_add(slot, ds_now() - t0);
        slot->ops++;
    }
}

/* The body of one append writer: records appended to DIR/a<id>. */
static void ds_append_writer(const struct ds_options *o, const char *dir,
                             int id, double deadline, const char *data,
                             struct ds_slot *slot)
{
    char path[1300];
    long n;
    int fd;

    snprintf(path, sizeof(path), "%s/a%d", dir, id);
    fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) { ds_fail(slot, "open"); return; }
    /* the file exists on disk before the clock starts */
    if (fsync(fd) != 0) { ds_fail(slot, "fsync"); close(fd); return; }
    for (n = 0; o->count > 0 ? n < o->count : ds_now() < deadline; n++) {
        double t0 = ds_now();

        if (ds_write_all(fd, data, o->record_bytes) != 0) {
            ds_fail(slot, "write");
            break;
        }
        if (fdatasync(fd) != 0) { ds_fail(slot, "fdatasync"); break; }
        ds_hist_add(slot, ds_now() - t0);
        slot->ops++;
    }
    close(fd);
}

/* Percentile q (0..1) of the summed histograms, in ms. */
static double ds_hist_pct(const uint64_t *sum, uint64_t total, double q)
{
    uint64_t want, seen = 0;
    size_t b;

    if (total == 0) return -1;
    want = (uint64_t)(q * (double)total);
    if (want >= total) want = total - 1;
    for (b = 0; b < DS_HIST_BUCKETS; b++) {
        seen += sum[b];
        if (seen > want) break;
    }
    if (b >= DS_HIST_BUCKETS) b = DS_HIST_BUCKETS - 1;
    /* the bucket's upper edge: never flatters */
    return (double)((b + 1) * DS_HIST_US) / 1000.0;
}

enum ds_kind { DS_CREATE_SHARED, DS_CREATE_OWN, DS_APPEND };

/*
 * One run of WRITERS processes of kind K in the fresh directory RUNDIR.
 * Returns 0 and fills *res, or -1 (a writer failed; reported).
 */
static int ds_run_writers(const struct ds_options *o, enum ds_kind k,
                          int writers, const char *rundir, const char *data,
                          struct ds_result *res)
{
    struct ds_slot *slots;
    size_t maplen = sizeof(*slots) * (size_t)writers;
    pid_t *pids;
    int go[2];
    int i, rc = 0;
    double start, end;
    uint64_t total = 0, *sum;

    slots = mmap(NULL, maplen, PROT_READ | PROT_WRITE,
                 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (slots == MAP_FAILED) {
        fprintf(stderr, "disksync: mmap: %s\n", strerror(errno));
        return -1;
    }
    pids = calloc((size_t)writers, sizeof(*pids));
    sum = calloc(DS_HIST_BUCKETS, sizeof(*sum));
    if (!pids || !sum || pipe(go) != 0) {
        fprintf(stderr, "disksync: out of memory or pipes\n");
        free(pids);
        free(sum);
        munmap(slots, maplen);
        return -1;
    }
    for (i = 0; i < writers; i++) {
        char dir[1200];

        if (k == DS_CREATE_OWN) {
            snprintf(dir, sizeof(dir), "%s/d%d", rundir, i);
            if (mkdir(dir, 0755) != 0) {
                fprintf(stderr, "disksync: mkdir %s: %s\n", dir,
                        strerror(errno));
                rc = -1;
                writers = i;
                break;
            }
        } else {
            snprintf(dir, sizeof(dir), "%s", rundir);
        }
        pids[i] = fork();
        if (pids[i] < 0) {
            fprintf(stderr, "disksync: fork: %s\n", strerror(errno));
            rc = -1;
            writers = i;
            break;
        }
        if (pids[i] == 0) {
            char c;
            double dl;

            close(go[1]);
            /* the barrier: the parent closes its end when all are forked */
            while (read(go[0], &c, 1) < 0 && errno == EINTR) {}
            dl = ds_now() + o->seconds;
            if (k == DS_APPEND)
                ds_append_writer(o, dir, i, dl, data, &slots[i]);
            else
                ds_create_writer(o, dir, i, dl, data, &slots[i]);
            _exit(slots[i].failed ? DS_EXIT_ERROR : DS_EXIT_OK);
        }
    }
    close(go[0]);
    /* the directories (and, for append, nothing else) reach the disk first */
    sync();
    start = ds_now();
    close(go[1]);
    for (i = 0; i < writers; i++) {
        int status;

        while (waitpid(pids[i], &status, 0) < 0 && errno == EINTR) {}
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) rc = -1;
    }
    end = ds_now();
    for (i = 0; i < writers; i++) {
        size_t b;

        if (slots[i].failed) {
            fprintf(stderr, "disksync: writer %d: %s: %s\n", i,
                    slots[i].what, strerror(slots[i].failed));
            rc = -1;
        }
        total += slots[i].ops;
        for (b = 0; b < DS_HIST_BUCKETS; b++) sum[b] += slots[i].hist[b];
    }
    if (rc == 0) {
        /* with -t the clock is the deadline, each writer finishing the
           operation it began; with -n the wall time of the slowest */
        res->rate = (double)total / (end - start);
        res->p50_ms = ds_hist_pct(sum, total, 0.50);
        res->p99_ms = ds_hist_pct(sum, total, 0.99);
        res->max_ms = ds_hist_pct(sum, total, 1.0);
    }
    free(pids);
    free(sum);
    munmap(slots, maplen);
    return rc;
}

/* Sequential synced writes: MB/s. */
static int ds_run_seq(const struct ds_options *o, const char *rundir,
                      struct ds_result *res)
{
    char path[1300];
    char *chunk;
    long i, chunks = o->seq_mb;
    double t0, t1;
    int fd;

    chunk = malloc(DS_SEQ_CHUNK);
    if (!chunk) return -1;
    memset(chunk, 'x', DS_SEQ_CHUNK);
    snprintf(path, sizeof(path), "%s/seq", rundir);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        fprintf(stderr, "disksync: open %s: %s\n", path, strerror(errno));
        free(chunk);
        return -1;
    }
    t0 = ds_now();
    for (i = 0; i < chunks; i++) {
        if (ds_write_all(fd, chunk, DS_SEQ_CHUNK) != 0 || fdatasync(fd) != 0) {
            fprintf(stderr, "disksync: seq write %s: %s\n", path,
                    strerror(errno));
            close(fd);
            free(chunk);
            return -1;
        }
    }
    t1 = ds_now();
    close(fd);
    free(chunk);
    res->rate = (double)chunks * DS_SEQ_CHUNK / (1024.0 * 1024.0) / (t1 - t0);
    res->p50_ms = res->p99_ms = res->max_ms = -1;
    return 0;
}

/* DS_SYNCFS_FILES unsynced files, then one syncfs(): the syncfs time. */
static int ds_run_syncfs(const struct ds_options *o, const char *rundir,
                         const char *data, struct ds_result *res)
{
    char path[1300];
    double t0;
    int i, fd, dfd;

    sync();
    for (i = 0; i < DS_SYNCFS_FILES; i++) {
        snprintf(path, sizeof(path), "%s/u%d", rundir, i);
        fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 || ds_write_all(fd, data, o->file_bytes) != 0) {
            fprintf(stderr, "disksync: %s: %s\n", path, strerror(errno));
            if (fd >= 0) close(fd);
            return -1;
        }
        close(fd);
    }
    dfd = open(rundir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0) return -1;
    t0 = ds_now();
    if (syncfs(dfd) != 0) {
        fprintf(stderr, "disksync: syncfs: %s\n", strerror(errno));
        close(dfd);
        return -1;
    }
    res->rate = (ds_now() - t0) * 1000.0;   /* ms, reported as such */
    res->p50_ms = res->p99_ms = res->max_ms = -1;
    close(dfd);
    return 0;
}

static int ds_cmp_result(const void *a, const void *b)
{
    const struct ds_result *x = a, *y = b;

    return (x->rate > y->rate) - (x->rate < y->rate);
}

static void ds_fmt_ms(char *out, size_t len, double ms)
{
    if (ms < 0) snprintf(out, len, "-");
    else if (ms < 10) snprintf(out, len, "%.2f", ms);
    else snprintf(out, len, "%.0f", ms);
}

/*
 * One table row: RUNS runs of a cell, each in a fresh directory.
 * Returns 0, or -1 when a run failed (the row says so).
 */
static int ds_cell(const struct ds_options *o, const char *test,
                   const char *layout, int writers, const char *unit,
                   const char *data,
                   int (*runner)(const struct ds_options *, int, const char *,
                                 const char *, struct ds_result *, int),
                   int arg)
{
    struct ds_result res[DS_MAX_RUNS], med;
    char rundir[1100], p50[32], p99[32], max[32];
    int r, n = 0;

    for (r = 0; r < o->runs && !ds_interrupted; r++) {
        snprintf(rundir, sizeof(rundir), "%s/run", ds_scratch);
        ds_rmtree(rundir);
        if (mkdir(rundir, 0755) != 0) {
            fprintf(stderr, "disksync: mkdir %s: %s\n", rundir,
                    strerror(errno));
            return -1;
        }
        if (runner(o, writers, rundir, data, &res[n], arg) != 0) {
            printf("| %s | %d | %s | failed | | | | |\n", test, writers,
                   layout);
            fflush(stdout);
            ds_rmtree(rundir);
            return -1;
        }
        ds_progress(o, "%s %s writers=%d run %d: %.1f %s", test, layout,
                    writers, r + 1, res[n].rate, unit);
        n++;
        ds_rmtree(rundir);
    }
    if (n == 0) return -1;
    qsort(res, (size_t)n, sizeof(res[0]), ds_cmp_result);
    med = res[n / 2];
    if (n % 2 == 0) med.rate = (res[n / 2 - 1].rate + res[n / 2].rate) / 2;
    ds_fmt_ms(p50, sizeof(p50), med.p50_ms);
    ds_fmt_ms(p99, sizeof(p99), med.p99_ms);
    ds_fmt_ms(max, sizeof(max), med.max_ms);
    printf("| %s | %d | %s | %.0f %s | %.0f-%.0f | %s | %s | %s |\n", test,
           writers, layout, med.rate, unit, res[0].rate, res[n - 1].rate, p50,
           p99, max);
    fflush(stdout);
    return 0;
}

static int ds_runner_writers(const struct ds_options *o, int writers,
                             const char *rundir, const char *data,
                             struct ds_result *res, int kind)
{
    return ds_run_writers(o, (enum ds_kind)kind, writers, rundir, data, res);
}

static int ds_runner_seq(const struct ds_options *o, int writers,
                         const char *rundir, const char *data,
                         struct ds_result *res, int arg)
{
    (void)writers;
    (void)data;
    (void)arg;
    return ds_run_seq(o, rundir, res);
}

static int ds_runner_syncfs(const struct ds_options *o, int writers,
                            const char *rundir, const char *data,
                            struct ds_result *res, int arg)
{
    (void)writers;
    (void)arg;
    return ds_run_syncfs(o, rundir, data, res);
}

static int ds_parse_list(const char *s, int *out, int max, int *n_r)
{
    char *copy = strdup(s), *tok, *save = NULL;
    int n = 0;

    if (!copy) return -1;
    for (tok = strtok_r(copy, " ,", &save); tok;
         tok = strtok_r(NULL, " ,", &save)) {
        char *end;
        long v = strtol(tok, &end, 10);

        if (*end || v < 1 || v > DS_MAX_WRITERS || n >= max) {
            free(copy);
            return -1;
        }
        out[n++] = (int)v;
    }
    free(copy);
    *n_r = n;
    return n > 0 ? 0 : -1;
}

static int ds_parse_tests(const char *s, int *tests_r)
{
    char *copy = strdup(s), *tok, *save = NULL;
    int t = 0;

    if (!copy) return -1;
    for (tok = strtok_r(copy, " ,", &save); tok;
         tok = strtok_r(NULL, " ,", &save)) {
        if (!strcmp(tok, "create")) t |= DS_TEST_CREATE;
        else if (!strcmp(tok, "append")) t |= DS_TEST_APPEND;
        else if (!strcmp(tok, "seq")) t |= DS_TEST_SEQ;
        else if (!strcmp(tok, "syncfs")) t |= DS_TEST_SYNCFS;
        else if (!strcmp(tok, "all")) t |= 15;
        else {
            free(copy);
            return -1;
        }
    }
    free(copy);
    *tests_r = t;
    return t ? 0 : -1;
}

static void ds_usage(FILE *f)
{
    fputs(
"Usage: disksync [-d DIR] [-t SECONDS | -n COUNT] [-r RUNS] [-w LIST]\n"
"                [-a LIST] [-s BYTES] [-b BYTES] [-m MB] [-x TESTS] [-q]\n"
"\n"
"The disk's own limit: synced file creations, synced appends, synced\n"
"sequential writes, one syncfs() after many unsynced files.\n"
"\n"
"  -d DIR      where to write (default /var/tmp; the real disk)\n"
"  -t SECONDS  length of each run (default 3)\n"
"  -n COUNT    operations per writer instead of a length\n"
"  -r RUNS     runs per cell; the median is reported (default 3)\n"
"  -w LIST     writer counts for create (default \"1 4 16 100\")\n"
"  -a LIST     writer counts for append (default \"1 16\")\n"
"  -s BYTES    size of each created file (default 13870)\n"
"  -b BYTES    size of each appended record (default 512)\n"
"  -m MB       total of the sequential write (default 256)\n"
"  -x TESTS    create,append,seq,syncfs or all (default all)\n"
"  -q          no progress lines on stderr\n"
"  -h          this text\n"
"Output: a markdown table on stdout.  Exit status: 0 done, 1 a run\n"
"failed, 2 usage.\n", f);
}

int main(int argc, char **argv)
{
    struct ds_options o = {
        .dir = "/var/tmp",
        .seconds = 3,
        .runs = 3,
        .create_writers = { 1, 4, 16, 100 },
        .ncreate = 4,
        .append_writers = { 1, 16 },
        .nappend = 2,
        .file_bytes = 13870,
        .record_bytes = 512,
        .seq_mb = 256,
        .tests = 15,
    };
    struct sigaction sa;
    struct statfs sfs;
    char *data;
    size_t datalen;
    int c, i, rc = DS_EXIT_OK;
    const char *fs = "?";

    static const struct option ds_longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };

    while ((c = getopt_long(argc, argv, "d:t:n:r:w:a:s:b:m:x:qh", ds_longopts,
                            NULL)) != -1) {
        char *end = NULL;

        switch (c) {
        case 'd': o.dir = optarg; break;
        case 't':
            o.seconds = strtod(optarg, &end);
            if (*end || o.seconds <= 0 || o.seconds > 3600) goto usage;
            break;
        case 'n':
            o.count = strtol(optarg, &end, 10);
            if (*end || o.count < 1 || o.count > 100000000) goto usage;
            break;
        case 'r':
            o.runs = (int)strtol(optarg, &end, 10);
            if (*end || o.runs < 1 || o.runs > DS_MAX_RUNS) goto usage;
            break;
        case 'w':
            if (ds_parse_list(optarg, o.create_writers, 32, &o.ncreate) != 0)
                goto usage;
            break;
        case 'a':
            if (ds_parse_list(optarg, o.append_writers, 32, &o.nappend) != 0)
                goto usage;
            break;
        case 's':
            o.file_bytes = (size_t)strtol(optarg, &end, 10);
            if (*end || o.file_bytes < 1 || o.file_bytes > 64 * 1024 * 1024)
                goto usage;
            break;
        case 'b':
            o.record_bytes = (size_t)strtol(optarg, &end, 10);
            if (*end || o.record_bytes < 1 || o.record_bytes > 64 * 1024 * 1024)
                goto usage;
            break;
        case 'm':
            o.seq_mb = strtol(optarg, &end, 10);
            if (*end || o.seq_mb < 1 || o.seq_mb > 1024 * 1024) goto usage;
            break;
        case 'x':
            if (ds_parse_tests(optarg, &o.tests) != 0) goto usage;
            break;
        case 'q': o.quiet = 1; break;
        case 'h': ds_usage(stdout); return DS_EXIT_OK;
        default: goto usage;
        }
    }
    if (optind != argc) goto usage;

    if (strlen(o.dir) > 900) goto usage;
    snprintf(ds_scratch, sizeof(ds_scratch), "%s/disksync.XXXXXX", o.dir);
    if (!mkdtemp(ds_scratch)) {
        fprintf(stderr, "disksync: mkdtemp %s: %s\n", ds_scratch,
                strerror(errno));
        return DS_EXIT_ERROR;
    }
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = ds_on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (statfs(ds_scratch, &sfs) == 0) {
        if (sfs.f_type == 0x01021994) fs = "tmpfs";
        else if (sfs.f_type == 0xEF53) fs = "ext2/3/4";
        else if (sfs.f_type == 0x58465342) fs = "xfs";
        else if (sfs.f_type == 0x9123683E) fs = "btrfs";
    }
    if (!strcmp(fs, "tmpfs"))
        fprintf(stderr, "disksync: warning: %s is on tmpfs: syncs cost "
                        "nothing there\n", o.dir);

    datalen = o.file_bytes > o.record_bytes ? o.file_bytes : o.record_bytes;
    data = malloc(datalen);
    if (!data) {
        ds_rmtree(ds_scratch);
        return DS_EXIT_ERROR;
    }
    for (i = 0; i < (int)datalen; i++) data[i] = (char)('a' + i % 26);

    printf("disksync: %s (%s), %d runs per cell, %s, files of %zu bytes, "
           "records of %zu bytes\n\n", o.dir, fs, o.runs,
           o.count > 0 ? "fixed count" : "fixed time", o.file_bytes,
           o.record_bytes);
    if (o.count > 0) {
        printf("(each writer does %ld operations per run)\n\n", o.count);
    } else {
        printf("(each run lasts %.1f s)\n\n", o.seconds);
    }
    printf("| test | writers | directories | rate (median) | range | p50 ms "
           "| p99 ms | max ms |\n");
    printf("|---|---:|---|---:|---:|---:|---:|---:|\n");
    fflush(stdout);

    if (o.tests & DS_TEST_CREATE) {
        for (i = 0; i < o.ncreate && !ds_interrupted; i++) {
            if (ds_cell(&o, "create+fsync", "shared", o.create_writers[i],
                        "files/s", data, ds_runner_writers,
                        DS_CREATE_SHARED) != 0)
                rc = DS_EXIT_ERROR;
        }
        for (i = 0; i < o.ncreate && !ds_interrupted; i++) {
            if (o.create_writers[i] == 1) continue; /* same as shared */
            if (ds_cell(&o, "create+fsync", "own", o.create_writers[i],
                        "files/s", data, ds_runner_writers,
                        DS_CREATE_OWN) != 0)
                rc = DS_EXIT_ERROR;
        }
    }
    if (o.tests & DS_TEST_APPEND) {
        for (i = 0; i < o.nappend && !ds_interrupted; i++) {
            if (ds_cell(&o, "append+fdatasync", "own files",
                        o.append_writers[i], "appends/s", data,
                        ds_runner_writers, DS_APPEND) != 0)
                rc = DS_EXIT_ERROR;
        }
    }
    if ((o.tests & DS_TEST_SEQ) && !ds_interrupted) {
        if (ds_cell(&o, "sequential 1 MiB+fdatasync", "-", 1, "MB/s", data,
                    ds_runner_seq, 0) != 0)
            rc = DS_EXIT_ERROR;
    }
    if ((o.tests & DS_TEST_SYNCFS) && !ds_interrupted) {
        char test[64];

        snprintf(test, sizeof(test), "syncfs after %d unsynced files",
                 DS_SYNCFS_FILES);
        /* "rate" is the time of the syncfs(): lower is better */
        if (ds_cell(&o, test, "shared", 1, "ms", data, ds_runner_syncfs,
                    0) != 0)
            rc = DS_EXIT_ERROR;
    }
    printf("\nrate: operations per second of all writers together (create: "
           "open+write+fsync+close of a new file; append: write+fdatasync); "
           "p50/p99/max: one operation's latency (10 us buckets) in the run "
           "with the median rate; syncfs: its time in ms (range = fastest-"
           "slowest run).\n");
    free(data);
    ds_rmtree(ds_scratch);
    if (ds_interrupted) {
        fprintf(stderr, "disksync: interrupted\n");
        return DS_EXIT_ERROR;
    }
    return rc;

usage:
    ds_usage(stderr);
    return DS_EXIT_USAGE;
}
