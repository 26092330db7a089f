/*
 * ctl_cyrusdb.c - recover or checkpoint every database of a directory.
 *
 *   ctl_cyrusdb [-C imapd.conf] [-d DIR] [-q] -r | -c
 *
 * -r (recover) runs each backend's whole-directory recovery
 * (cyrusdb_recover: Berkeley DB environment recovery and the like), then
 * takes every regular file directly in DIR that cyrusdb_detect()
 * recognises, opens it with its own backend (skiplist replays or cuts off
 * an interrupted commit on open), checks it with cyrusdb_consistent() and
 * closes it.  -c (checkpoint) runs cyrusdb_checkpoint_dir() and then
 * cyrusdb_checkpoint() on each such file (skiplist repack, flat rewrite,
 * Berkeley DB log checkpoint).  One line per file goes to stdout.
 *
 * Recovery must run while no other process uses the databases: the master
 * runs "ctl_cyrusdb -r" before it starts any worker.
 *
 * With -r and a configuration file (and no -d), every database file of the
 * store is first checked against its configured backend
 * (store/dbcheck.c): a mismatch (mboxlist_db changed without converting
 * mailboxes.db) stops it with exit status 1 and a message naming the file,
 * both backends and the cvt_cyrusdb command that converts it, on stderr
 * and, when stderr leads nowhere (a daemonized master), in syslog: the
 * master's START then fails before any worker could answer 451.
 *
 * With -r and a configuration file (and no -d), the store's layout
 * version (CONFIGDIR/cyrusdeliver.version, store/layout.h) is checked
 * after that: a newer layout than this build knows stops it with exit
 * status 1 and a message naming both; a missing file is written (a
 * store from before the file is layout 1).
 *
 * With -c, started by the master (START or EVENTS: its parent is
 * CYRUSDELIVER_MASTER_PID) and metrics on (metrics_listen), the run's
 * duration and its failed files go to a slot of the metrics file
 * (lib/metrics.h), which the master folds when it reaps this process.  Run
 * by hand it claims no slot.
 *
 * Started as root it becomes cyrus_user first (lib/privs.c); with -d and
 * no -C, the owner of DIR.
 *
 * DIR is the configdirectory of imapd.conf unless -d names it.  Files that
 * are not databases (lock files, logs) are listed as skipped, as are files
 * of formats this program recognises but cannot open (twoskip).  Any failure
 * on a database makes the exit status 1; the other files are still done.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/metrics.h"
#include "lib/privs.h"
#include "store/dbcheck.h"
#include "store/journal.h"
#include "store/layout.h"

#define CTL_EXIT_OK 0
#define CTL_EXIT_ERROR 1
#define CTL_EXIT_USAGE 2

#define CTL_DEFAULT_CONFIG IMAPCONF_DEFAULT_PATH

static const char *ctl_progname = "ctl_cyrusdb";

static void ctl_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] [-d DIR] [-q] -r | -c\n"
"\n"
"Recover (-r) or checkpoint (-c) every cyrusdb database in a directory.\n"
"\n"
"  -r        recovery: first check every database file of the store against\n"
"            its configured backend (mboxlist_db, duplicate_db, quota_db,\n"
"            seenstate_db, subscription_db; not with -d): a file in\n"
"            another format stops here with the cvt_cyrusdb command that\n"
"            converts it; then check the store's layout version\n"
"            (CONFIGDIR/cyrusdeliver.version: a newer one stops here, a\n"
"            missing one is written); then run each backend's directory recovery (Berkeley DB\n"
"            environments), then open every database file in DIR with the\n"
"            backend that wrote it (which finishes or cuts off an\n"
"            interrupted commit), check it, and close it.  Run it only\n"
"            while no other process uses the databases (the master runs it\n"
"            at start-up, before any worker).\n"
"  -c        checkpoint: flush and trim Berkeley DB logs, then compact each\n"
"            database file (skiplist repack, flat rewrite, ...).\n"
"  -d DIR    the directory (default: configdirectory from imapd.conf)\n"
"  -C FILE   the imapd.conf to read (default %s; when that file does not\n"
"            exist, the built-in defaults are used)\n"
"  -q        print only failures\n"
"  -h, --help  this text\n"
"\n"
"Only regular files directly in DIR are looked at; each one's backend is\n"
"found from its contents.  Files that are not databases are skipped.\n"
"One line per file: FILE: BACKEND: what was done.\n"
"Started as root it becomes cyrus_user (imapd.conf) first; with -d and no\n"
"-C, the owner of DIR.\n"
"Exit status: 0 all went well, 1 some database failed (each failure is\n"
"reported on stderr), 2 usage error.\n"
"Example:\n"
"  %s -C /etc/imapd.conf -r\n",
            ctl_progname, CTL_DEFAULT_CONFIG, ctl_progname);
}

struct ctl_counts {
    unsigned done, skipped, failed;
};

static int ctl_quiet;

static void ctl_say(const char *path, const char *format, const char *what)
{
    if (!ctl_quiet)
        printf("%s: %s: %s\n", path, format, what);
}

static void ctl_failed(struct ctl_counts *n, const char *path,
                       const char *format, const char *what, int r)
{
    fprintf(stderr, "%s: %s: %s: %s: %s\n", ctl_progname, path, format, what,
            cyrusdb_strerror(r));
    n->failed++;
}

/*
 * The key order (CYRUSDB_MBOXSORT or not) is not recorded in the files, so
 * a file is opened in the order its name says (mailboxes.db and quotas.db
 * are in mailbox order, as the store opens them) and checked; if it is not consistent
 * in that order it is tried in the other one.  The backends refuse to
 * rewrite a file in an order it is not in, so a wrong first guess changes
 * nothing.  On success *db_r is open in the order that fits.
 */
static int ctl_open_in_order(const char *path, const char *backend,
                             struct cyrusdb **db_r, const char **err_r)
{
    const char *base = strrchr(path, '/') ? strrchr(path, '/') + 1 : path;
    /* the store opens these in mailbox order (store/mboxlist.c,
     * store/quota.c, store/subs.c); everything else in byte order */
    size_t blen = strlen(base);
    int first = (!strcmp(base, "mailboxes.db") || !strcmp(base, "quotas.db") ||
                 (blen > 4 && !strcmp(base + blen - 4, ".sub")))
                    ? CYRUSDB_MBOXSORT : 0;
    int r;

    /* the first try is quiet: its failure only means "the other order" */
    log_init(ctl_progname, LOG_TO_NONE);
    r = cyrusdb_open(backend, path, first, db_r, err_r);
    if (r == CYRUSDB_OK && cyrusdb_consistent(*db_r) == CYRUSDB_IOERROR)
        cyrusdb_close(db_r);
    log_init(ctl_progname, LOG_TO_STDERR);
    if (r == CYRUSDB_OK && *db_r)
        return CYRUSDB_OK;
    if (r != CYRUSDB_OK && r != CYRUSDB_IOERROR)
        return cyrusdb_open(backend, path, first, db_r, err_r);
    return cyrusdb_open(backend, path, first ^ CYRUSDB_MBOXSORT, db_r, err_r);
}

static void ctl_one_file(const char *path, int checkpoint,
                         struct ctl_counts *n);

/* Recover or checkpoint one file of DIR; a failed checkpoint counted in
 * the metrics by database. */
static void ctl_one(const char *path, int checkpoint, struct ctl_counts *n)
{
    unsigned failed = n->failed;

    ctl_one_file(path, checkpoint, n);
    if (checkpoint && n->failed != failed && metrics_slot)
        metrics_add64(
            &metrics_slot->checkpoint_failures[metrics_db_index(path)], 1);
}

static void ctl_one_file(const char *path, int checkpoint,
                         struct ctl_counts *n)
{
    const struct cyrusdb_registry_entry *e;
    const char *format = NULL, *err = NULL;
    struct cyrusdb *db = NULL;
    int r;

    r = cyrusdb_detect(path, &format);
    if (r == CYRUSDB_BADFORMAT) {
        ctl_say(path, "-", "not a database, skipped");
        n->skipped++;
        return;
    }
    if (r != CYRUSDB_OK) {
        ctl_failed(n, path, "-", "cannot read", r);
        return;
    }
    e = cyrusdb_lookup(format);
    if (!e) {
        ctl_say(path, format, "format not supported here, skipped");
        n->skipped++;
        return;
    }

    r = ctl_open_in_order(path, e->name, &db, &err);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "%s: %s\n", ctl_progname,
                err && *err ? err : cyrusdb_strerror(r));
        n->failed++;
        return;
    }
    if (checkpoint) {
        r = cyrusdb_checkpoint(db);
        if (r == CYRUSDB_NOTIMPLEMENTED) {
            ctl_say(path, format, "nothing to checkpoint");
        } else if (r != CYRUSDB_OK) {
            ctl_failed(n, path, format, "checkpoint failed", r);
            cyrusdb_close(&db);
            return;
        }
    } else {
        r = cyrusdb_consistent(db);
        if (r != CYRUSDB_OK && r != CYRUSDB_NOTIMPLEMENTED) {
            ctl_failed(n, path, format, "not consistent after recovery", r);
            cyrusdb_close(&db);
            return;
        }
    }
    r = cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        ctl_failed(n, path, format, "close failed", r);
        return;
    }
    if (checkpoint)
        ctl_say(path, format, "checkpointed");
    else
        ctl_say(path, format, "recovered, consistent");
    n->done++;
}

static int ctl_scan(const char *dir, int checkpoint, struct ctl_counts *n)
{
    struct dirent **names = NULL;
    struct buf path = BUF_INITIALIZER;
    int count, i;

    count = scandir(dir, &names, NULL, alphasort);
    if (count < 0) {
        fprintf(stderr, "%s: %s: cannot read directory: %s\n", ctl_progname,
                dir, strerror(errno));
        return -1;
    }
    for (i = 0; i < count; i++) {
        struct stat st;

        buf_reset(&path);
        buf_printf(&path, "%s/%s", dir, names[i]->d_name);
        if (lstat(buf_cstring(&path), &st) == 0 && S_ISREG(st.st_mode))
            ctl_one(buf_cstring(&path), checkpoint, n);
        free(names[i]);
    }
    free(names);
    buf_free(&path);
    return 0;
}

/* Directory-wide recovery or checkpoint of dir, then every file in it. */
static void ctl_dir(const char *dir, int checkpoint, struct ctl_counts *n)
{
    int r;

    r = checkpoint ? cyrusdb_checkpoint_dir(dir) : cyrusdb_recover(dir);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "%s: %s: directory %s failed: %s\n", ctl_progname,
                dir, checkpoint ? "checkpoint" : "recovery",
                cyrusdb_strerror(r));
        n->failed++;
    }
    if (ctl_scan(dir, checkpoint, n) < 0)
        n->failed++;
}

/* The per-user databases of the mailbox store (seen state, subscriptions)
 * live in DIR/user/H/: each such directory is handled like DIR. */
static void ctl_user_dirs(const char *dir, int checkpoint, struct ctl_counts *n)
{
    struct dirent **names = NULL;
    struct buf user = BUF_INITIALIZER, sub = BUF_INITIALIZER;
    struct stat st;
    int count, i;

    buf_printf(&user, "%s/user", dir);
    if (lstat(buf_cstring(&user), &st) != 0 || !S_ISDIR(st.st_mode)) {
        buf_free(&user);
        return;
    }
    count = scandir(buf_cstring(&user), &names, NULL, alphasort);
    if (count < 0) {
        fprintf(stderr, "%s: %s: cannot read directory: %s\n", ctl_progname,
                buf_cstring(&user), strerror(errno));
        n->failed++;
        buf_free(&user);
        return;
    }
    for (i = 0; i < count; i++) {
        buf_reset(&sub);
        buf_printf(&sub, "%s/%s", buf_cstring(&user), names[i]->d_name);
        if (names[i]->d_name[0] != '.' &&
            lstat(buf_cstring(&sub), &st) == 0 && S_ISDIR(st.st_mode))
            ctl_dir(buf_cstring(&sub), checkpoint, n);
        free(names[i]);
    }
    free(names);
    buf_free(&user);
    buf_free(&sub);
}

/* A message the admin must see: stderr, and syslog too when stderr leads
 * nowhere (run by a master that daemonized). */
static void ctl_alert(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void ctl_alert(const char *fmt, ...)
{
    struct stat st, nul;
    char line[4096];
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s: %s\n", ctl_progname, line);
    if (fstat(2, &st) < 0 ||
        (S_ISCHR(st.st_mode) && stat("/dev/null", &nul) == 0 &&
         st.st_rdev == nul.st_rdev)) {
        log_init(ctl_progname, LOG_TO_SYSLOG);
        log_error("%s", line);
        log_init(ctl_progname, LOG_TO_STDERR);
    }
}

/* cvt_cyrusdb beside this program, when it is there. */
static const char *ctl_cvt_path(void)
{
    static char path[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 20);
    char *slash;

    if (n <= 0)
        return NULL;
    path[n] = '\0';
    slash = strrchr(path, '/');
    if (!slash)
        return NULL;
    strcpy(slash + 1, "cvt_cyrusdb");
    return access(path, X_OK) == 0 ? path : NULL;
}

/* 1 when the master started this process (so it reaps it and folds a
 * metrics slot): its parent is CYRUSDELIVER_MASTER_PID. */
static int ctl_master_child(void)
{
    const char *v = getenv("CYRUSDELIVER_MASTER_PID");
    char *end;
    long pid;

    if (!v || !*v)
        return 0;
    errno = 0;
    pid = strtol(v, &end, 10);
    return !errno && !*end && pid > 1 && (pid_t)pid == getppid();
}

static void ctl_mismatch(void *rock, const struct dbcheck_mismatch *m)
{
    struct buf b = BUF_INITIALIZER;

    if (dbcheck_advice(m, rock, ctl_cvt_path(), &b) == 0)
        ctl_alert("%s", buf_cstring(&b));
    buf_free(&b);
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { NULL, 0, NULL, 0 }
    };
    const char *config = NULL, *dir = NULL;
    struct imapconf *conf = NULL;
    struct ctl_counts n = { 0, 0, 0 };
    char *cdir = NULL;
    int mode = 0, opt, conf_from_file = 0, dir_opt = 0, config_opt = 0;
    struct stat st;

    log_init(argv[0], LOG_TO_STDERR);
    if (argv[0])
        ctl_progname = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];

    while ((opt = getopt_long(argc, argv, "C:d:rcqh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': config = optarg; config_opt = 1; break;
        case 'd': dir = optarg; dir_opt = 1; break;
        case 'q': ctl_quiet = 1; break;
        case 'r':
        case 'c':
            if (mode && mode != opt) {
                fprintf(stderr, "%s: give either -r or -c, not both\n", ctl_progname);
                return CTL_EXIT_USAGE;
            }
            mode = opt;
            break;
        case 'h': ctl_usage(stdout); return CTL_EXIT_OK;
        default:
            fprintf(stderr, "Try '%s --help' for more information.\n", ctl_progname);
            return CTL_EXIT_USAGE;
        }
    }
    if (!mode || optind != argc) {
        fprintf(stderr, "%s: %s\nTry '%s --help' for more information.\n",
                ctl_progname, mode ? "unexpected argument" : "need -r or -c",
                ctl_progname);
        return CTL_EXIT_USAGE;
    }

    /* the configuration: -C FILE, else the default file when it exists,
     * else (only with -d) the built-in defaults */
    {
        char *cerr = NULL;
        const char *cfile = config ? config : CTL_DEFAULT_CONFIG;

        if (!config && stat(cfile, &st) < 0 && errno == ENOENT) {
            conf = imapconf_defaults();
            conf_from_file = 0;
        } else if (imapconf_load(cfile, &conf, &cerr) < 0) {
            fprintf(stderr, "%s: %s\n", ctl_progname, cerr ? cerr : cfile);
            free(cerr);
            return CTL_EXIT_ERROR;
        } else {
            conf_from_file = 1;
        }
        if (!conf) {
            fprintf(stderr, "%s: out of memory\n", ctl_progname);
            return CTL_EXIT_ERROR;
        }
        config = cfile;
    }
    if (!dir) {
        const char *cd = imapconf_getstring(conf, "configdirectory");
        if (!cd || !*cd) {
            fprintf(stderr, "%s: no configdirectory in %s\n", ctl_progname,
                    config);
            imapconf_free(&conf);
            return CTL_EXIT_ERROR;
        }
        cdir = strdup(cd);
        if (!cdir) {
            fprintf(stderr, "%s: out of memory\n", ctl_progname);
            imapconf_free(&conf);
            return CTL_EXIT_ERROR;
        }
        dir = cdir;
    }

    /* started as root: become the server's user (cyrus_user of the
     * configuration; with -d and no -C, the owner of DIR) before any file
     * is opened, so that none becomes root's */
    {
        const char *perr = NULL;
        int pr = !(dir_opt && !config_opt)
                     ? privs_drop_to_cyrus_user(conf, &perr)
                     : privs_drop_to_owner(dir, &perr);
        if (pr != PRIVS_OK) {
            ctl_alert("%s", perr);
            imapconf_free(&conf);
            free(cdir);
            return CTL_EXIT_ERROR;
        }
    }

    /* recovery is the last step before the workers start: a database
     * whose file does not match its configured backend stops it here,
     * with what to do, rather than every delivery later */
    if (mode == 'r' && conf_from_file && !dir_opt) {
        int bad = dbcheck_backends(conf, ctl_mismatch, (void *)config);
        if (bad != 0) {
            if (bad < 0)
                ctl_alert("cannot check the database backends of %s",
                          config);
            else
                ctl_alert("%d database file%s do%s not match the "
                          "configured backend; not recovering", bad,
                          bad == 1 ? "" : "s", bad == 1 ? "es" : "");
            imapconf_free(&conf);
            free(cdir);
            return CTL_EXIT_ERROR;
        }
    }
    /* the master folds the slot of a checkpoint it started */
    if (mode == 'c' && ctl_master_child())
        metrics_attach(conf);

    /* the store's layout version: a newer one stops the start, none is
     * written (store/layout.h) */
    if (mode == 'r' && conf_from_file && !dir_opt && stat(dir, &st) == 0) {
        const char *lerr = NULL;
        int found = 0, lr = layout_check(dir, &found, &lerr);

        if (lr < 0) {
            ctl_alert("%s; not recovering", lerr ? lerr : "layout check failed");
            imapconf_free(&conf);
            free(cdir);
            return CTL_EXIT_ERROR;
        }
        if (!ctl_quiet)
            printf("%s: layout %d dir=<%s>%s\n", ctl_progname, LAYOUT_VERSION,
                   dir, found == 0 ? " (version file written)"
                        : lr == LAYOUT_UPGRADED ? " (upgraded)" : "");
    }

    if (stat(dir, &st) < 0) {
        fprintf(stderr, "%s: %s: %s\n", ctl_progname, dir, strerror(errno));
        imapconf_free(&conf);
        free(cdir);
        return CTL_EXIT_ERROR;
    }
    if (!S_ISDIR(st.st_mode)) {
        fprintf(stderr, "%s: %s: not a directory\n", ctl_progname, dir);
        imapconf_free(&conf);
        free(cdir);
        return CTL_EXIT_ERROR;
    }

    {
        uint64_t t0 = metrics_now_us(), t1;

        ctl_dir(dir, mode == 'c', &n);
        ctl_user_dirs(dir, mode == 'c', &n);
        t1 = metrics_now_us();
        if (mode == 'c' && metrics_slot)
            metrics_observe(&metrics_slot->checkpoint,
                            t1 > t0 ? t1 - t0 : 0);
    }

    /* after the databases: the delivery journals of the partitions
     * (spool_sync: journal) put back what a power loss took */
    if (mode == 'r' && conf_from_file && !dir_opt) {
        struct journal_replay_stats js;

        if (journal_replay_all(conf, &js) != 0 || js.failed)
            n.failed++;
        if (!ctl_quiet && js.records)
            printf("%s: journal replay: %lu records, %lu files restored, "
                   "%lu index records restored, %lu failures\n",
                   ctl_progname, js.records, js.files_written,
                   js.records_added, js.failed);
    }
    imapconf_free(&conf);

    if (!ctl_quiet || n.failed)
        printf("%s: %s dir=<%s>: %u databases done, %u files skipped, "
               "%u failures\n", ctl_progname,
               mode == 'r' ? "recovery" : "checkpoint", dir, n.done,
               n.skipped, n.failed);
    free(cdir);
    metrics_detach();
    if (fflush(stdout) == EOF)
        return CTL_EXIT_ERROR;
    return n.failed ? CTL_EXIT_ERROR : CTL_EXIT_OK;
}
