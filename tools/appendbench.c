/*
 * appendbench.c - delivery throughput of the mailbox store.
 *
 *   appendbench [-m LIST] [-D LIST] [-Q LIST] [-S LIST] [-p LIST] [-R LIST]
 *               [-n MSGS] [-s SIZE] [-u USERS] [-r RUNS] [-d DIR] [--markdown]
 *
 * A benchmark, not a test.  Each cell delivers messages of SIZE bytes
 * (default 13,870, the field reports' message size) with the whole work of
 * a delivery agent per message (store/deliver.c): mailbox list lookup and
 * duplicate check per recipient, staging, reservation in each mailbox, one
 * durable commit, duplicate records.  P processes (fork()ed, each with its
 * own handles) deliver MSGS messages each, to R recipients each, chosen
 * round-robin among USERS mailboxes, all at once from a barrier.  The
 * figure is messages per second (deliveries per second = messages x R),
 * the median of RUNS runs, each in a fresh directory on the real disk
 * (DIR, default /var/tmp), plus the syncs issued per message: file and
 * directory fsyncs and group commit syncfs() rounds, from the shared
 * counters of CONFIGDIR/commit.shm (commit_shared_stats(), every process
 * of the run together).
 *
 * -S LIST sets spool_sync (group, file, off; comma-separated: each
 * configuration is measured with each) in the imapd.conf it writes;
 * without -S the key is not written (the default, group).
 *
 * Configurations: every backend of -m as mboxlist_db (with duplicate_db
 * at its default), then every backend of -D as duplicate_db (mboxlist_db
 * at its default), then every backend of -Q as quota_db with every
 * mailbox a quota root (without roots, quota costs nothing).
 */
#include "config.h"

#include <errno.h>
#include <ftw.h>
#include <getopt.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/strarray.h"
#include "store/append.h"
#include "store/commit.h"
#include "store/deliver.h"
#include "store/mboxlist.h"
#include "store/quota.h"
#include "store/store.h"

#define AB_EXIT_OK 0
#define AB_EXIT_ERROR 1
#define AB_EXIT_USAGE 2
#define AB_MAX_PROCS 64
#define AB_MAX_RCPTS 64
#define AB_MAX_RUNS 99
#define AB_DEFAULT_DIR "/var/tmp"

static const char *ab_progname = "appendbench";

struct ab_opts {
    struct strarray mboxlist_dbs;
    struct strarray duplicate_dbs;
    struct strarray quota_dbs;
    struct strarray syncs;   /* spool_sync values; empty = not written */
    int procs[8], nprocs;
    int rcpts[8], nrcpts;
    int msgs;          /* per process */
    int size;
    int users;
    int runs;
    const char *dir;
    int markdown;
};

/* The databases of one configuration; qdb NULL = no quota roots;
 * sync NULL = spool_sync not written. */
struct ab_dbs {
    const char *mdb, *ddb, *qdb;
    const char *sync;
};

/* What a child reports through its pipe. */
struct ab_child_report {
    int ok;                   /* 1 when every delivery succeeded */
    unsigned long delivered;  /* messages */
    unsigned long file_syncs, dir_syncs, rounds;
};

static void ab_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-m LIST] [-D LIST] [-Q LIST] [-S LIST] [-p LIST] [-R LIST]\n"
"          [-n MSGS] [-s SIZE] [-u USERS] [-r RUNS] [-d DIR] [--markdown]\n"
"\n"
"Delivery throughput of the mailbox store: messages/second, median of RUNS.\n"
"  -m LIST   mboxlist_db backends to measure (default: all), comma-separated\n"
"  -D LIST   duplicate_db backends to measure (default: all)\n"
"  -Q LIST   quota_db backends to measure, with every mailbox a quota root\n"
"            (default: all; without roots quota costs nothing)\n"
"  -S LIST   spool_sync values to measure: group, file, off (default: not\n"
"            set, i.e. group); off is UNSAFE (no sync at all)\n"
"  -p LIST   process counts (default 1,8)\n"
"  -R LIST   recipients per message (default 1,10)\n"
"  -n MSGS   messages per process per run (default 200)\n"
"  -s SIZE   message size in bytes (default 13870)\n"
"  -u USERS  mailboxes delivered to (default 100)\n"
"  -r RUNS   runs per cell (default 3)\n"
"  -d DIR    where the scratch directories go (default %s; use a directory\n"
"            on the disk you want to measure, not tmpfs)\n"
"  --markdown  print the table as markdown\n",
            ab_progname, AB_DEFAULT_DIR);
}

static int ab_parse_ints(const char *s, int *out, int max, int lo, int hi)
{
    char *copy = strdup(s), *tok, *save = NULL, *end;
    int n = 0;
    long v;

    if (!copy)
        return -1;
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        errno = 0;
        v = strtol(tok, &end, 10);
        if (errno || *end || v < lo || v > hi || n == max) {
            free(copy);
            return -1;
        }
        out[n++] = (int)v;
    }
    free(copy);
    return n ? n : -1;
}

static int ab_parse_backends(const char *s, struct strarray *out)
{
    char *copy = strdup(s), *tok, *save = NULL;

    if (!copy)
        return -1;
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (!cyrusdb_lookup(tok)) {
            fprintf(stderr, "%s: unknown backend \"%s\" (known: %s)\n",
                    ab_progname, tok, cyrusdb_names());
            free(copy);
            return -1;
        }
        strarray_append(out, tok);
    }
    free(copy);
    return out->count ? 0 : -1;
}

static int ab_parse_syncs(const char *s, struct strarray *out)
{
    char *copy = strdup(s), *tok, *save = NULL;

    if (!copy)
        return -1;
    for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        if (strcmp(tok, "group") && strcmp(tok, "file") && strcmp(tok, "off")) {
            fprintf(stderr, "%s: unknown spool_sync \"%s\" (group, file, off)\n",
                    ab_progname, tok);
            free(copy);
            return -1;
        }
        strarray_append(out, tok);
    }
    free(copy);
    return out->count ? 0 : -1;
}

static int ab_rm_one(const char *path, const struct stat *st, int flag,
                     struct FTW *ftw)
{
    (void)st;
    (void)flag;
    (void)ftw;
    return remove(path);
}

static void ab_rmrf(const char *dir)
{
    nftw(dir, ab_rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

static double ab_now(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

/* Write DIR/imapd.conf and load it. */
static struct imapconf *ab_config(const char *dir, const struct ab_dbs *dbs)
{
    struct buf text = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct imapconf *conf = NULL;
    char *err = NULL;
    FILE *f;

    buf_printf(&text, "configdirectory: %s/conf\npartition-default: %s/spool\n"
               "mboxlist_db: %s\nduplicate_db: %s\n",
               dir, dir, dbs->mdb, dbs->ddb);
    if (dbs->qdb)
        buf_printf(&text, "quota_db: %s\n", dbs->qdb);
    if (dbs->sync)
        buf_printf(&text, "spool_sync: %s\n", dbs->sync);
    buf_printf(&path, "%s/conf", dir);
    fs_mkdir_p(buf_cstring(&path), 0755);
    buf_reset(&path);
    buf_printf(&path, "%s/spool", dir);
    fs_mkdir_p(buf_cstring(&path), 0755);
    buf_reset(&path);
    buf_printf(&path, "%s/imapd.conf", dir);
    f = fopen(buf_cstring(&path), "w");
    if (f) {
        fwrite(text.s, 1, text.len, f);
        fclose(f);
        if (imapconf_load(buf_cstring(&path), &conf, &err) != 0) {
            fprintf(stderr, "%s: %s\n", ab_progname, err ? err : "no memory");
            free(err);
        }
    }
    buf_free(&text);
    buf_free(&path);
    return conf;
}

/* A message of `size` bytes with a unique Message-ID. */
static void ab_message(struct buf *m, int size, int proc, int seq)
{
    static const char line[] =
        "The quick brown fox jumps over the lazy dog. 0123456789 abcdefghij\r\n";

    buf_reset(m);
    buf_printf(m, "Return-Path: <bench@example.org>\r\n"
               "From: Bench <bench@example.org>\r\n"
               "To: Users <users@example.org>\r\n"
               "Subject: appendbench %d.%d\r\n"
               "Message-ID: <%d.%d.%ld@appendbench.example.org>\r\n"
               "Date: Sat, 21 Nov 2026 12:00:00 +0000\r\n\r\n",
               proc, seq, proc, seq, (long)getpid());
    while (m->len + sizeof(line) - 1 <= (size_t)size)
        buf_append(m, line, sizeof(line) - 1);
    while (m->len < (size_t)size)
        buf_putc(m, m->len + 2 == (size_t)size ? '\r' :
                    m->len + 1 == (size_t)size ? '\n' : 'x');
}

/* One child: wait at the barrier, deliver, report. */
static void ab_child(const struct ab_opts *o, const struct imapconf *conf,
                     int proc, int nrcpt, int barrier_fd, int report_fd)
{
    struct ab_child_report rep = { 1, 0, 0, 0, 0 };
    struct deliver_rcpt rcpts[AB_MAX_RCPTS];
    char names[AB_MAX_RCPTS][32];
    struct deliver_ctx *ctx = NULL;
    struct commit_stats cs0, cs1;
    struct buf msg = BUF_INITIALIZER, id = BUF_INITIALIZER;
    struct append_stage *st;
    char c;
    int i, j, next = proc * 7919, r;

    /* every input field but the name stays zero (no flags, the
     * message's own stage) */
    memset(rcpts, 0, sizeof(rcpts));
    if (deliver_ctx_new(conf, &ctx) != STORE_OK)
        rep.ok = 0;
    if (read(barrier_fd, &c, 1) < 0)   /* EOF when the parent lets go */
        rep.ok = 0;
    commit_stats_get(&cs0);
    for (i = 0; rep.ok && i < o->msgs; i++) {
        ab_message(&msg, o->size, proc, i);
        for (j = 0; j < nrcpt; j++) {
            snprintf(names[j], sizeof(names[j]), "user.u%d",
                     (next + j) % o->users);
            rcpts[j].mailbox = names[j];
        }
        next += nrcpt;
        st = NULL;
        r = append_stage_open(conf, NULL, &st);
        if (r == STORE_OK)
            r = append_stage_write(st, msg.s, msg.len);
        if (r == STORE_OK)
            r = append_stage_close(st);
        if (r == STORE_OK) {
            deliver_find_msgid(msg.s, msg.len, &id);
            r = deliver_message(ctx, st, id.s, id.len, rcpts, (size_t)nrcpt, 0);
        }
        for (j = 0; r == STORE_OK && j < nrcpt; j++)
            if (rcpts[j].duplicate)
                r = STORE_INTERNAL;   /* every Message-ID is new */
        for (j = 0; r == STORE_OK && j < nrcpt; j++)
            if (rcpts[j].result != STORE_OK)
                r = rcpts[j].result;
        if (r != STORE_OK) {
            fprintf(stderr, "%s: delivery failed: %s\n", ab_progname,
                    store_strerror(r));
            rep.ok = 0;
        } else {
            rep.delivered++;
        }
        if (st)
            append_stage_free(&st);
    }
    commit_stats_get(&cs1);
    rep.rounds = cs1.rounds - cs0.rounds;
    rep.file_syncs = cs1.file_syncs - cs0.file_syncs;
    rep.dir_syncs = cs1.dir_syncs - cs0.dir_syncs;
    if (ctx)
        deliver_ctx_free(&ctx);
    buf_free(&msg);
    buf_free(&id);
    if (write(report_fd, &rep, sizeof(rep)) != (ssize_t)sizeof(rep))
        _exit(1);
    _exit(rep.ok ? 0 : 1);
}

/* One run: fresh directory, USERS mailboxes, P processes.  Returns
 * messages/second (or -1) and the syncs per message in *syncs_r. */
static double ab_run(const struct ab_opts *o, const struct ab_dbs *dbs,
                     int nproc, int nrcpt, double *syncs_r)
{
    char tmpl[4096];
    struct imapconf *conf = NULL;
    struct mboxlist *ml = NULL;
    struct ab_child_report rep;
    struct commit_shared_stats sh0, sh1;
    pid_t pids[AB_MAX_PROCS];
    int barrier[2] = { -1, -1 }, report[2] = { -1, -1 };
    int i, ok = 1, status;
    unsigned long delivered = 0, syncs = 0;
    double t0, t1 = 0, rate = -1;
    char name[32];

    snprintf(tmpl, sizeof(tmpl), "%s/appendbench.XXXXXX", o->dir);
    if (!mkdtemp(tmpl)) {
        fprintf(stderr, "%s: %s: %s\n", ab_progname, tmpl, strerror(errno));
        return -1;
    }
    conf = ab_config(tmpl, dbs);
    if (!conf || mboxlist_open(conf, &ml) != STORE_OK)
        goto out;
    if (dbs->qdb) {
        /* every mailbox its own quota root, limits far away: each delivery
         * checks and updates its recipients' roots */
        struct quota_db *q = NULL;

        if (quota_open(conf, &q) != STORE_OK)
            goto out;
        for (i = 0; i < o->users; i++) {
            snprintf(name, sizeof(name), "user.u%d", i);
            if (quota_set(q, name, 1LL << 40, 1LL << 40) != STORE_OK) {
                quota_close(&q);
                goto out;
            }
        }
        quota_close(&q);
    }
    for (i = 0; i < o->users; i++) {
        snprintf(name, sizeof(name), "user.u%d", i);
        if (mboxlist_create(ml, name, NULL, NULL, NULL) != STORE_OK) {
            fprintf(stderr, "%s: cannot create %s\n", ab_progname, name);
            goto out;
        }
    }
    mboxlist_close(&ml);
    /* the shared counters before the run (none yet: all zero) */
    if (commit_shared_stats(conf, &sh0) != STORE_OK)
        memset(&sh0, 0, sizeof(sh0));
    if (pipe(barrier) < 0 || pipe(report) < 0)
        goto out;
    for (i = 0; i < nproc; i++) {
        pids[i] = fork();
        if (pids[i] == 0) {
            close(barrier[1]);
            close(report[0]);
            ab_child(o, conf, i, nrcpt, barrier[0], report[1]);
        }
        if (pids[i] < 0) {
            nproc = i;
            ok = 0;
            break;
        }
    }
    close(barrier[0]);
    close(report[1]);
    barrier[0] = report[1] = -1;
    usleep(200000);   /* let every child open its databases */
    t0 = ab_now();
    close(barrier[1]);
    barrier[1] = -1;
    for (i = 0; i < nproc; i++) {
        if (read(report[0], &rep, sizeof(rep)) != (ssize_t)sizeof(rep)) {
            ok = 0;
            continue;
        }
        t1 = ab_now();
        if (!rep.ok)
            ok = 0;
        delivered += rep.delivered;
    }
    for (i = 0; i < nproc; i++) {
        if (waitpid(pids[i], &status, 0) < 0 || !WIFEXITED(status) ||
            WEXITSTATUS(status) != 0)
            ok = 0;
    }
    /* every sync of every process: fsyncs of files and directories and
     * group commit syncfs() rounds */
    if (ok && commit_shared_stats(conf, &sh1) == STORE_OK)
        syncs = (unsigned long)((sh1.file_syncs - sh0.file_syncs) +
                                (sh1.dir_syncs - sh0.dir_syncs) +
                                (sh1.syncfs_calls - sh0.syncfs_calls));
    else
        ok = 0;
    if (ok && delivered && t1 > t0) {
        rate = delivered / (t1 - t0);
        *syncs_r = (double)syncs / delivered;
    }
out:
    if (ml)
        mboxlist_close(&ml);
    if (barrier[1] >= 0)
        close(barrier[1]);
    if (report[0] >= 0)
        close(report[0]);
    imapconf_free(&conf);
    ab_rmrf(tmpl);
    return rate;
}

static int ab_cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;

    return x < y ? -1 : x > y;
}

static void ab_cell(const struct ab_opts *o, const struct ab_dbs *dbs,
                    int nproc, int nrcpt)
{
    double rates[AB_MAX_RUNS], syncs[AB_MAX_RUNS], s = 0;
    char label[160];
    int i, n = 0;

    if (dbs->qdb)
        snprintf(label, sizeof(label), "mboxlist_db=%s dup=%s quota=%s",
                 dbs->mdb, dbs->ddb, dbs->qdb);
    else
        snprintf(label, sizeof(label), "mboxlist_db=%s dup=%s", dbs->mdb,
                 dbs->ddb);
    if (dbs->sync)
        snprintf(label + strlen(label), sizeof(label) - strlen(label),
                 " sync=%s", dbs->sync);

    for (i = 0; i < o->runs; i++) {
        double r = ab_run(o, dbs, nproc, nrcpt, &s);

        if (r < 0)
            break;
        rates[n] = r;
        syncs[n] = s;
        n++;
    }
    if (n < o->runs) {
        printf(o->markdown ? "| %s | %d | %d | failed | | |\n"
                           : "%-32s %5d %5d  failed\n", label, nproc, nrcpt);
        fflush(stdout);
        return;
    }
    qsort(rates, (size_t)n, sizeof(double), ab_cmp_double);
    qsort(syncs, (size_t)n, sizeof(double), ab_cmp_double);
    if (o->markdown)
        printf("| %s | %d | %d | %.0f | %.0f-%.0f | %.0f | %.1f |\n", label,
               nproc, nrcpt, rates[n / 2], rates[0], rates[n - 1],
               rates[n / 2] * nrcpt, syncs[n / 2]);
    else
        printf("%-32s %5d %5d %9.0f %7.0f-%-7.0f %10.0f %7.1f\n", label, nproc,
               nrcpt, rates[n / 2], rates[0], rates[n - 1],
               rates[n / 2] * nrcpt, syncs[n / 2]);
    fflush(stdout);
}

/* One cell per spool_sync value of -S (one without -S). */
static void ab_cells(const struct ab_opts *o, const struct ab_dbs *dbs,
                     int nproc, int nrcpt)
{
    struct ab_dbs d = *dbs;
    size_t i;

    if (o->syncs.count == 0) {
        ab_cell(o, dbs, nproc, nrcpt);
        return;
    }
    for (i = 0; i < o->syncs.count; i++) {
        d.sync = o->syncs.data[i];
        ab_cell(o, &d, nproc, nrcpt);
    }
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "markdown", no_argument, NULL, 'M' },
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    struct ab_opts o = { STRARRAY_INITIALIZER, STRARRAY_INITIALIZER,
                         STRARRAY_INITIALIZER, STRARRAY_INITIALIZER,
                         { 1, 8 }, 2, { 1, 10 }, 2, 200, 13870, 100, 3,
                         AB_DEFAULT_DIR, 0 };
    struct imapconf *defaults;
    const char *defm, *defd;
    struct utsname un;
    size_t b;
    int opt, p, q;

    log_init(ab_progname, LOG_TO_STDERR);
    log_set_info(0);
    while ((opt = getopt_long(argc, argv, "m:D:Q:S:p:R:n:s:u:r:d:h", longopts,
                              NULL)) != -1) {
        switch (opt) {
        case 'm':
            if (ab_parse_backends(optarg, &o.mboxlist_dbs))
                return AB_EXIT_USAGE;
            break;
        case 'D':
            if (ab_parse_backends(optarg, &o.duplicate_dbs))
                return AB_EXIT_USAGE;
            break;
        case 'Q':
            if (ab_parse_backends(optarg, &o.quota_dbs))
                return AB_EXIT_USAGE;
            break;
        case 'S':
            if (ab_parse_syncs(optarg, &o.syncs))
                goto usage;
            break;
        case 'p':
            if ((o.nprocs = ab_parse_ints(optarg, o.procs, 8, 1, AB_MAX_PROCS)) < 0)
                goto usage;
            break;
        case 'R':
            if ((o.nrcpts = ab_parse_ints(optarg, o.rcpts, 8, 1, AB_MAX_RCPTS)) < 0)
                goto usage;
            break;
        case 'n':
            if (ab_parse_ints(optarg, &o.msgs, 1, 1, 1000000) < 0)
                goto usage;
            break;
        case 's':
            if (ab_parse_ints(optarg, &o.size, 1, 300, 64 << 20) < 0)
                goto usage;
            break;
        case 'u':
            if (ab_parse_ints(optarg, &o.users, 1, 1, 100000) < 0)
                goto usage;
            break;
        case 'r':
            if (ab_parse_ints(optarg, &o.runs, 1, 1, AB_MAX_RUNS) < 0)
                goto usage;
            break;
        case 'd': o.dir = optarg; break;
        case 'M': o.markdown = 1; break;
        case 'h': ab_usage(stdout); return AB_EXIT_OK;
        default: goto usage;
        }
    }
    if (optind != argc)
        goto usage;
    for (q = 0; q < o.nrcpts; q++)
        if (o.rcpts[q] > o.users) {
            fprintf(stderr, "%s: more recipients than mailboxes\n", ab_progname);
            return AB_EXIT_USAGE;
        }
    defaults = imapconf_defaults();
    if (!defaults)
        return AB_EXIT_ERROR;
    defm = imapconf_getstring(defaults, "mboxlist_db");
    defd = imapconf_getstring(defaults, "duplicate_db");
    if (o.mboxlist_dbs.count == 0 && o.duplicate_dbs.count == 0 &&
        o.quota_dbs.count == 0) {
        /* every distinct backend of the registry (aliases left out: an
         * alias has the same table and variant as an earlier row) */
        const struct cyrusdb_registry_entry *e, *f;

        for (e = cyrusdb_registry; e->name; e++) {
            for (f = cyrusdb_registry; f < e; f++)
                if (f->backend == e->backend && f->variant == e->variant)
                    break;
            if (f < e)
                continue;
            strarray_append(&o.mboxlist_dbs, e->name);
            strarray_append(&o.duplicate_dbs, e->name);
            strarray_append(&o.quota_dbs, e->name);
        }
    }

    uname(&un);
    printf("%sappendbench: %s %s, %ld CPUs; %d messages of %d bytes per process "
           "per run, %d mailboxes; median of %d runs; scratch in %s\n",
           o.markdown ? "" : "# ", un.nodename, un.release,
           sysconf(_SC_NPROCESSORS_ONLN), o.msgs, o.size, o.users, o.runs,
           o.dir);
    if (o.markdown)
        printf("\n| configuration | procs | rcpts | msgs/s | range | "
               "deliveries/s | syncs/msg |\n|---|---|---|---|---|---|---|\n");
    else
        printf("%-32s %5s %5s %9s %15s %10s %7s\n", "configuration", "procs",
               "rcpts", "msgs/s", "range", "deliv/s", "syncs");
    for (b = 0; b < o.mboxlist_dbs.count; b++) {
        struct ab_dbs dbs = { o.mboxlist_dbs.data[b], defd, NULL, NULL };

        for (p = 0; p < o.nprocs; p++)
            for (q = 0; q < o.nrcpts; q++)
                ab_cells(&o, &dbs, o.procs[p], o.rcpts[q]);
    }
    for (b = 0; b < o.duplicate_dbs.count; b++) {
        struct ab_dbs dbs = { defm, o.duplicate_dbs.data[b], NULL, NULL };

        if (strcmp(o.duplicate_dbs.data[b], defd) == 0 &&
            o.mboxlist_dbs.count > 0)
            continue;   /* that configuration was measured above */
        for (p = 0; p < o.nprocs; p++)
            for (q = 0; q < o.nrcpts; q++)
                ab_cells(&o, &dbs, o.procs[p], o.rcpts[q]);
    }
    for (b = 0; b < o.quota_dbs.count; b++) {
        struct ab_dbs dbs = { defm, defd, o.quota_dbs.data[b], NULL };

        for (p = 0; p < o.nprocs; p++)
            for (q = 0; q < o.nrcpts; q++)
                ab_cells(&o, &dbs, o.procs[p], o.rcpts[q]);
    }
    imapconf_free(&defaults);
    strarray_fini(&o.mboxlist_dbs);
    strarray_fini(&o.quota_dbs);
    strarray_fini(&o.duplicate_dbs);
    strarray_fini(&o.syncs);
    return AB_EXIT_OK;

usage:
    ab_usage(stderr);
    return AB_EXIT_USAGE;
}
