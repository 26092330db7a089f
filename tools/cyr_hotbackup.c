/*
 * cyr_hotbackup.c - a consistent copy of a running store, and its restore.
 *
 *   cyr_hotbackup [-C imapd.conf] [-q] DESTDIR
 *   cyr_hotbackup [-C imapd.conf] [-q] --restore SRCDIR
 *
 * The backup is made while the server runs; nothing is stopped.  DESTDIR
 * (new or empty) receives
 *
 *   DESTDIR/config/            the configdirectory's databases and files
 *   DESTDIR/partition/NAME/    the spool of each partition-NAME
 *   DESTDIR/cyrusdeliver-backup   written last: a backup without it is
 *                              incomplete
 *
 * Order, and why it gives a consistent snapshot (doc/ARCHITECTURE.md,
 * "Backup"):
 *   1. the mailbox list, copied record by record under the database's
 *      write lock (one transaction: a snapshot); every later step works
 *      from this copy;
 *   2. the duplicate database, under its lock: a duplicate record is
 *      written after the message's commit, so every record copied names
 *      a message that step 3 finds;
 *   3. per mailbox of the copied list, under the mailbox's shared lock
 *      (appends and expunges wait; they need the exclusive one): the
 *      message file of every committed record of the index is hard-linked
 *      (copied across file systems; message files never change), then
 *      cyrus.index and cyrus.header are copied byte for byte.  The index
 *      copied can name only files that exist, and every file it names
 *      was linked under the same lock;
 *   4. quota, seen and subscription databases under their locks (quota
 *      is brought in line with the indexes at the next write lock of each
 *      mailbox; seen and subscriptions name uids and mailboxes that may
 *      be newer than the snapshot, which is harmless);
 *   5. mailboxes.uidvalidity (after every index, so it is at least every
 *      copied uidvalidity) and cyrusdeliver.version.
 * Databases are copied through the cyrusdb API with the backend that
 * wrote them, into a new file of the same backend: a consistent image
 * for every backend (skiplist, flat, Berkeley DB, LMDB) without relying
 * on a backend's own hot-backup tool.
 *
 * --restore copies a complete backup into the configdirectory and the
 * partitions of imapd.conf, which must hold no mailbox list yet (a fresh
 * installation); message files are hard-linked when possible.  Then
 * start the master (its START runs ctl_cyrusdb -r), or run
 * "ctl_cyrusdb -r" by hand; "mbtool check -a" verifies every mailbox.
 *
 * For the tests only: --test-order=files-first copies a mailbox's
 * message files (a directory listing, no lock) before its index (under
 * the lock): the wrong order, which loses files the index names;
 * --test-hook=CMD runs CMD (sh -c) once per mailbox between the two
 * halves of its copy, so a test can deliver a message there.
 *
 * Exit status: 0 done, 1 failed (the message says what), 2 usage.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/privs.h"
#include "lib/strarray.h"
#include "store/duplicate.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/quota.h"
#include "store/store.h"

#define BACKUP_EXIT_OK 0
#define BACKUP_EXIT_FAIL 1
#define BACKUP_EXIT_USAGE 2

#define BACKUP_DEFAULT_CONFIG IMAPCONF_DEFAULT_PATH
#define BACKUP_MARKER "cyrusdeliver-backup"
#define BACKUP_CONFIG_SUBDIR "config"
#define BACKUP_PARTITION_SUBDIR "partition"

static const char *backup_progname = "cyr_hotbackup";
static int backup_quiet;
static int backup_files_first;        /* --test-order=files-first */
static const char *backup_hook;       /* --test-hook */

static void backup_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] [-q] DESTDIR\n"
"       %s [-C imapd.conf] [-q] --restore SRCDIR\n"
"\n"
"Copy the store (databases, mailbox list, spool) of a running server into\n"
"DESTDIR (new or empty) as a consistent snapshot, or restore such a copy\n"
"into a fresh configdirectory and partitions.\n"
"\n"
"  -C FILE       imapd.conf (default %s)\n"
"  -q            quiet: no progress lines\n"
"  -r, --restore restore SRCDIR into the configdirectory and partitions of\n"
"                imapd.conf (which must hold no mailbox list yet); then\n"
"                run ctl_cyrusdb -r (the master's START does) and\n"
"                mbtool check -a\n"
"  -h, --help    this text\n"
"\n"
"Backup order: mailbox list, duplicate database, then per mailbox under\n"
"its lock the message files its index names followed by the index; then\n"
"quota, seen and subscription databases.  See cyr_hotbackup(8).\n",
            backup_progname, backup_progname, BACKUP_DEFAULT_CONFIG);
}

static int backup_usage_error(const char *what)
{
    fprintf(stderr, "%s: %s\n", backup_progname, what);
    backup_usage(stderr);
    return BACKUP_EXIT_USAGE;
}

static void backup_say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void backup_say(const char *fmt, ...)
{
    va_list ap;

    if (backup_quiet)
        return;
    va_start(ap, fmt);
    vprintf(fmt, ap);
    va_end(ap);
    putchar('\n');
    fflush(stdout);
}

/* "a/b" into out; a path over PATH_MAX stops the program (only main's
 * callees use it). */
static void backup_join(char *out, size_t size, const char *a, const char *b)
{
    int n = snprintf(out, size, "%s/%s", a, b);

    if (n < 0 || (size_t)n >= size) {
        fprintf(stderr, "%s: path too long: %s/%s\n", backup_progname, a, b);
        exit(BACKUP_EXIT_FAIL);
    }
}

/* ---- files ----------------------------------------------------------- */

/* Copy src to dst (created, must not exist), synced. 0 or -1 (errno). */
static int backup_copy_file(const char *src, const char *dst)
{
    char chunk[65536];
    int in, out, e;
    ssize_t n;

    in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return -1;
    out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (out < 0) {
        e = errno;
        close(in);
        errno = e;
        return -1;
    }
    for (;;) {
        n = read(in, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        if (fs_write_all(out, chunk, (size_t)n) < 0) {
            n = -1;
            break;
        }
    }
    e = errno;
    if (n == 0 && fs_datasync(out) < 0) {
        n = -1;
        e = errno;
    }
    close(in);
    if (close(out) < 0 && n == 0) {
        n = -1;
        e = errno;
    }
    if (n < 0) {
        unlink(dst);
        errno = e;
        return -1;
    }
    return 0;
}

/* A message file: hard link, or a copy where links do not work. */
static int backup_link_file(const char *src, const char *dst)
{
    if (link(src, dst) == 0)
        return 0;
    if (errno == EXDEV || errno == EPERM || errno == EMLINK)
        return backup_copy_file(src, dst);
    return -1;
}

/* A directory empty or missing? 1 yes, 0 no, -1 error. */
static int backup_dir_empty(const char *dir)
{
    DIR *d = opendir(dir);
    struct dirent *de;
    int empty = 1;

    if (!d)
        return errno == ENOENT ? 1 : -1;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, "..")) {
            empty = 0;
            break;
        }
    }
    closedir(d);
    return empty;
}

/* Is name "N." (a message file)? */
static int backup_is_message_name(const char *name)
{
    const char *p = name;

    if (*p < '0' || *p > '9')
        return 0;
    while (*p >= '0' && *p <= '9')
        p++;
    return p[0] == '.' && p[1] == '\0';
}

/* Copy the tree src into dst (restore): directories made, message files
 * linked, others copied, sockets and the like skipped.  0 or -1. */
static int backup_copy_tree(const char *src, const char *dst)
{
    struct buf s = BUF_INITIALIZER, d = BUF_INITIALIZER;
    struct dirent *de;
    struct stat st;
    DIR *dir;
    int r = 0;

    if (fs_mkdir_p(dst, 0750) < 0) {
        fprintf(stderr, "%s: mkdir %s: %s\n", backup_progname, dst,
                strerror(errno));
        return -1;
    }
    dir = opendir(src);
    if (!dir) {
        fprintf(stderr, "%s: %s: %s\n", backup_progname, src, strerror(errno));
        return -1;
    }
    while (r == 0 && (de = readdir(dir)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        buf_reset(&s);
        buf_reset(&d);
        if (buf_printf(&s, "%s/%s", src, de->d_name) < 0
            || buf_printf(&d, "%s/%s", dst, de->d_name) < 0) {
            r = -1;
            break;
        }
        if (lstat(buf_cstring(&s), &st) < 0) {
            r = -1;
        } else if (S_ISDIR(st.st_mode)) {
            r = backup_copy_tree(buf_cstring(&s), buf_cstring(&d));
            continue;
        } else if (S_ISREG(st.st_mode)) {
            r = backup_is_message_name(de->d_name)
                ? backup_link_file(buf_cstring(&s), buf_cstring(&d))
                : backup_copy_file(buf_cstring(&s), buf_cstring(&d));
        }
        if (r < 0)
            fprintf(stderr, "%s: copy %s to %s: %s\n", backup_progname,
                    buf_cstring(&s), buf_cstring(&d), strerror(errno));
    }
    closedir(dir);
    if (r == 0 && fs_fsync_dir(dst) < 0)
        r = -1;
    buf_free(&s);
    buf_free(&d);
    return r;
}

/* ---- databases ------------------------------------------------------- */

struct backup_dbcopy {
    struct cyrusdb *dst;
    struct cyrusdb_txn *tid;
    unsigned long records;
    int r;
};

static int backup_db_record(void *rock, const char *key, size_t keylen,
                            const char *data, size_t datalen)
{
    struct backup_dbcopy *c = rock;

    c->r = cyrusdb_store(c->dst, key, keylen, data, datalen, &c->tid);
    if (c->r != CYRUSDB_OK)
        return 1;
    c->records++;
    return 0;
}

/* The key order a database file is kept in, from its name. */
static int backup_db_order(const char *fname)
{
    const char *base = strrchr(fname, '/');
    size_t len;

    base = base ? base + 1 : fname;
    len = strlen(base);
    if (!strcmp(base, MBOXLIST_FNAME) || !strcmp(base, QUOTA_FNAME))
        return CYRUSDB_MBOXSORT;
    if (len > 4 && !strcmp(base + len - 4, ".sub"))
        return CYRUSDB_MBOXSORT;
    return 0;
}

/* Copy the database src (whatever backend wrote it) into a new file dst
 * of the same backend: every record, read in one transaction under the
 * database's write lock.  A missing src is not an error (1 returned). */
static int backup_copy_db(const char *src, const char *dst)
{
    struct backup_dbcopy c = { .dst = NULL, .tid = NULL, .records = 0,
                               .r = CYRUSDB_OK };
    struct cyrusdb *db = NULL;
    struct cyrusdb_txn *stid = NULL;
    const char *format = NULL, *err = NULL, *data;
    size_t datalen;
    int order = backup_db_order(src);
    int r;

    r = cyrusdb_detect(src, &format);
    if (r == CYRUSDB_NOTFOUND)
        return 1;
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "%s: %s: not a database this program can read: %s\n",
                backup_progname, src, cyrusdb_strerror(r));
        return -1;
    }
    r = cyrusdb_open(format, src, order | CYRUSDB_NOCOMPACT, &db, &err);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "%s: open %s (%s): %s\n", backup_progname, src,
                format, err ? err : cyrusdb_strerror(r));
        return -1;
    }
    if (fs_mkdir_parent(dst, 0750) < 0) {
        fprintf(stderr, "%s: mkdir for %s: %s\n", backup_progname, dst,
                strerror(errno));
        cyrusdb_close(&db);
        return -1;
    }
    r = cyrusdb_open(format, dst, order | CYRUSDB_CREATE | CYRUSDB_NOCOMPACT,
                     &c.dst, &err);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "%s: create %s (%s): %s\n", backup_progname, dst,
                format, err ? err : cyrusdb_strerror(r));
        cyrusdb_close(&db);
        return -1;
    }
    /* the write lock, so the walk sees one committed state */
    r = cyrusdb_fetchlock(db, "\001", 1, &data, &datalen, &stid);
    if (r == CYRUSDB_OK || r == CYRUSDB_NOTFOUND)
        r = cyrusdb_foreach(db, NULL, 0, NULL, backup_db_record, &c, &stid);
    if (stid)
        cyrusdb_abort(db, stid);
    if (r == 1)
        r = c.r;
    if (r == CYRUSDB_OK && c.tid)
        r = cyrusdb_commit(c.dst, c.tid);
    else if (c.tid)
        cyrusdb_abort(c.dst, c.tid);
    if (r == CYRUSDB_OK)
        r = cyrusdb_checkpoint(c.dst) == CYRUSDB_IOERROR ? CYRUSDB_IOERROR
                                                         : CYRUSDB_OK;
    cyrusdb_close(&c.dst);
    cyrusdb_close(&db);
    if (r != CYRUSDB_OK) {
        fprintf(stderr, "%s: copy %s: %s\n", backup_progname, src,
                cyrusdb_strerror(r));
        return -1;
    }
    backup_say("database %s backend=%s records=%lu", src, format, c.records);
    return 0;
}

/* Every per-user database (user/H/NAME.seen, .sub) of confdir. */
static int backup_copy_user_dbs(const char *confdir, const char *destconf)
{
    struct buf top = BUF_INITIALIZER, sub = BUF_INITIALIZER;
    struct buf s = BUF_INITIALIZER, d = BUF_INITIALIZER;
    struct dirent *de, *fe;
    DIR *t, *h;
    int r = 0;

    if (buf_printf(&top, "%s/user", confdir) < 0)
        return -1;
    t = opendir(buf_cstring(&top));
    if (!t) {
        buf_free(&top);
        return errno == ENOENT ? 0 : -1;
    }
    while (r == 0 && (de = readdir(t)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        buf_reset(&sub);
        buf_printf(&sub, "%s/%s", buf_cstring(&top), de->d_name);
        h = opendir(buf_cstring(&sub));
        if (!h)
            continue;
        while (r == 0 && (fe = readdir(h)) != NULL) {
            size_t len = strlen(fe->d_name);

            if (len < 5 || (strcmp(fe->d_name + len - 5, ".seen")
                            && strcmp(fe->d_name + len - 4, ".sub")))
                continue;
            buf_reset(&s);
            buf_reset(&d);
            buf_printf(&s, "%s/%s", buf_cstring(&sub), fe->d_name);
            buf_printf(&d, "%s/user/%s/%s", destconf, de->d_name, fe->d_name);
            if (backup_copy_db(buf_cstring(&s), buf_cstring(&d)) < 0)
                r = -1;
        }
        closedir(h);
    }
    closedir(t);
    buf_free(&top);
    buf_free(&sub);
    buf_free(&s);
    buf_free(&d);
    return r;
}

/* ---- the destination's configuration --------------------------------- */

struct backup_conftext {
    struct buf text;
    const char *destdir;
};

static void backup_conf_line(void *rock, const char *key, const char *value,
                             const char *def, unsigned long line)
{
    struct backup_conftext *ct = rock;

    (void)def;
    if (!strcmp(key, "configdirectory"))
        return;
    if (!strncasecmp(key, "partition-", 10)) {
        buf_printf(&ct->text, "%s: %s/%s/%s\n", key, ct->destdir,
                   BACKUP_PARTITION_SUBDIR, key + 10);
        return;
    }
    if (line == 0 || !strncasecmp(key, "sasl_", 5))
        return;
    buf_printf(&ct->text, "%s: %s\n", key, value);
}

/* A configuration naming the backup's directories, everything else as in
 * conf (backends, hashimapspool, virtual domains). */
static int backup_dest_conf(const struct imapconf *conf, const char *destdir,
                            struct imapconf **destconf_r)
{
    struct backup_conftext ct = { .text = BUF_INITIALIZER, .destdir = destdir };
    char *err = NULL;
    int r;

    buf_printf(&ct.text, "configdirectory: %s/%s\n", destdir,
               BACKUP_CONFIG_SUBDIR);
    imapconf_foreach(conf, backup_conf_line, &ct);
    r = imapconf_load_string("backup configuration", buf_cstring(&ct.text),
                             strlen(buf_cstring(&ct.text)), destconf_r, &err);
    if (r != 0)
        fprintf(stderr, "%s: %s\n", backup_progname,
                err ? err : "out of memory");
    free(err);
    buf_free(&ct.text);
    return r == 0 ? 0 : -1;
}

/* ---- the spool ------------------------------------------------------- */

struct backup_spool {
    const struct imapconf *conf;
    const struct imapconf *destconf;
    struct mboxlist *destml;
    struct strarray *gone;           /* mailboxes of the snapshot not found */
    unsigned long mailboxes, messages;
    int failed;
};

static void backup_run_hook(const char *name)
{
    int r;

    if (!backup_hook)
        return;
    setenv("CYR_HOTBACKUP_MAILBOX", name, 1);
    r = system(backup_hook);
    if (r != 0)
        fprintf(stderr, "%s: warning: test hook exited with status %d\n",
                backup_progname, r);
}

/* Link the message file of uid from src dir into dst dir. */
static int backup_message(const char *srcdir, const char *dstdir,
                          uint32_t uid, int must_exist)
{
    char s[PATH_MAX], d[PATH_MAX];

    snprintf(s, sizeof(s), "%s/%u.", srcdir, uid);
    snprintf(d, sizeof(d), "%s/%u.", dstdir, uid);
    if (backup_link_file(s, d) == 0)
        return 1;
    if (errno == ENOENT && !must_exist)
        return 0;
    if (errno == EEXIST)
        return 0;
    fprintf(stderr, "%s: %s: %s\n", backup_progname, s, strerror(errno));
    return -1;
}

/* The wrong order, for the tests: every message file of the directory,
 * listed without the lock, before the index. */
static int backup_files_unlocked(const char *srcdir, const char *dstdir)
{
    DIR *d = opendir(srcdir);
    struct dirent *de;
    int n = 0;

    if (!d)
        return -1;
    while ((de = readdir(d)) != NULL) {
        if (backup_is_message_name(de->d_name)
            && backup_message(srcdir, dstdir,
                              (uint32_t)strtoul(de->d_name, NULL, 10), 0) > 0)
            n++;
    }
    closedir(d);
    return n;
}

static int backup_mailbox(void *rock, const struct mboxlist_entry *e)
{
    struct backup_spool *sp = rock;
    struct buf dst = BUF_INITIALIZER;
    struct mailbox *mb = NULL;
    const struct mailbox_header *h;
    struct mailbox_record rec;
    char s[PATH_MAX], d[PATH_MAX];
    const char *srcdir;
    uint32_t recno;
    int r, n = 0;

    if (mailbox_spool_dir(sp->destconf, e->name, e->partition, &dst) != STORE_OK
        || fs_mkdir_p(buf_cstring(&dst), 0750) < 0) {
        fprintf(stderr, "%s: %s: no spool directory in the backup: %s\n",
                backup_progname, e->name, strerror(errno));
        sp->failed = 1;
        buf_free(&dst);
        return 0;
    }
    if (!backup_files_first)
        backup_run_hook(e->name);
    r = mailbox_open(sp->conf, e->name, e->partition, &mb);
    if (r == STORE_NOTFOUND) {
        strarray_append(sp->gone, e->name);
        buf_free(&dst);
        return 0;
    }
    if (r != STORE_OK) {
        fprintf(stderr, "%s: open mailbox %s: %s\n", backup_progname, e->name,
                store_strerror(r));
        sp->failed = 1;
        buf_free(&dst);
        return 0;
    }
    srcdir = mailbox_dir(mb);
    if (backup_files_first) {
        n = backup_files_unlocked(srcdir, buf_cstring(&dst));
        backup_run_hook(e->name);
    }
    r = mailbox_lock(mb, MAILBOX_LOCK_SHARED);
    if (r != STORE_OK) {
        fprintf(stderr, "%s: lock mailbox %s: %s\n", backup_progname, e->name,
                store_strerror(r));
        sp->failed = 1;
        mailbox_close(&mb);
        buf_free(&dst);
        return 0;
    }
    h = mailbox_get_header(mb);
    for (recno = 0; !backup_files_first && recno < h->num_records; recno++) {
        int k;

        r = mailbox_read_record(mb, recno, &rec);
        if (r != STORE_OK) {
            fprintf(stderr, "%s: %s record %u: %s\n", backup_progname,
                    e->name, recno, store_strerror(r));
            sp->failed = 1;
            break;
        }
        if (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
            continue;
        /* committed records must have their file; a pending append's file
         * is taken when it is there (recovery at the restored copy's first
         * write lock verifies it and commits or aborts it) */
        k = backup_message(srcdir, buf_cstring(&dst), rec.uid,
                           recno < h->visible);
        if (k < 0) {
            sp->failed = 1;
            break;
        }
        n += k;
    }
    backup_join(s, sizeof(s), srcdir, MAILBOX_INDEX_FNAME);
    backup_join(d, sizeof(d), buf_cstring(&dst), MAILBOX_INDEX_FNAME);
    if (backup_copy_file(s, d) < 0) {
        fprintf(stderr, "%s: copy %s: %s\n", backup_progname, s,
                strerror(errno));
        sp->failed = 1;
    }
    backup_join(s, sizeof(s), srcdir, MAILBOX_HEADER_FNAME);
    backup_join(d, sizeof(d), buf_cstring(&dst), MAILBOX_HEADER_FNAME);
    if (backup_copy_file(s, d) < 0 && errno != ENOENT) {
        fprintf(stderr, "%s: copy %s: %s\n", backup_progname, s,
                strerror(errno));
        sp->failed = 1;
    }
    mailbox_unlock(mb);
    mailbox_close(&mb);
    if (fs_fsync_dir(buf_cstring(&dst)) < 0)
        sp->failed = 1;
    sp->mailboxes++;
    sp->messages += (unsigned long)n;
    backup_say("mailbox %s messages=%d", e->name, n);
    buf_free(&dst);
    return 0;
}

/* ---- backup and restore ---------------------------------------------- */

static int backup_write_marker(const char *destdir, time_t started,
                               unsigned long mailboxes, unsigned long messages)
{
    char path[PATH_MAX], text[256];
    int fd, len, r = 0;

    backup_join(path, sizeof(path), destdir, BACKUP_MARKER);
    len = snprintf(text, sizeof(text),
                   "cyrusdeliver backup 1\nstarted %lld\nfinished %lld\n"
                   "mailboxes %lu\nmessages %lu\n", (long long)started,
                   (long long)time(NULL), mailboxes, messages);
    fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
    if (fd < 0 || fs_write_all(fd, text, (size_t)len) < 0 || fs_datasync(fd) < 0)
        r = -1;
    if (fd >= 0)
        close(fd);
    if (r == 0)
        r = fs_fsync_dir(destdir);
    return r;
}

/* Plain files of the configdirectory that belong to the store. */
static const char *const backup_plain_files[] = {
    MAILBOX_UIDVALIDITY_FNAME, "cyrusdeliver.version", NULL
};

static int backup_run(const struct imapconf *conf, const char *destdir)
{
    const char *confdir = imapconf_getstring(conf, "configdirectory");
    struct imapconf *destconf = NULL;
    struct backup_spool sp;
    struct strarray gone = STRARRAY_INITIALIZER;
    char s[PATH_MAX], d[PATH_MAX], destconfdir[PATH_MAX];
    time_t started = time(NULL);
    int i, r, failed = 0;

    if (!confdir || !*confdir) {
        fprintf(stderr, "%s: configdirectory is not set\n", backup_progname);
        return BACKUP_EXIT_FAIL;
    }
    r = backup_dir_empty(destdir);
    if (r <= 0) {
        fprintf(stderr, "%s: %s: %s\n", backup_progname, destdir,
                r < 0 ? strerror(errno) : "not empty (a backup goes into a "
                "new or empty directory)");
        return BACKUP_EXIT_FAIL;
    }
    backup_join(destconfdir, sizeof(destconfdir), destdir,
             BACKUP_CONFIG_SUBDIR);
    if (fs_mkdir_p(destconfdir, 0750) < 0) {
        fprintf(stderr, "%s: mkdir %s: %s\n", backup_progname, destconfdir,
                strerror(errno));
        return BACKUP_EXIT_FAIL;
    }
    if (backup_dest_conf(conf, destdir, &destconf) < 0)
        return BACKUP_EXIT_FAIL;

    /* 1. the mailbox list; 2. the duplicate database */
    backup_join(s, sizeof(s), confdir, MBOXLIST_FNAME);
    backup_join(d, sizeof(d), destconfdir, MBOXLIST_FNAME);
    if (backup_copy_db(s, d) < 0)
        failed = 1;
    backup_join(s, sizeof(s), confdir, DUPLICATE_FNAME);
    backup_join(d, sizeof(d), destconfdir, DUPLICATE_FNAME);
    if (!failed && backup_copy_db(s, d) < 0)
        failed = 1;

    /* 3. the spool, from the copied list */
    memset(&sp, 0, sizeof(sp));
    sp.conf = conf;
    sp.destconf = destconf;
    sp.gone = &gone;
    if (!failed) {
        r = mboxlist_open(destconf, &sp.destml);
        if (r == STORE_OK)
            r = mboxlist_list(sp.destml, "*", backup_mailbox, &sp);
        if (r != STORE_OK) {
            fprintf(stderr, "%s: the mailbox list: %s\n", backup_progname,
                    store_strerror(r));
            failed = 1;
        }
        /* mailboxes deleted (or renamed) since the list was copied: out
         * of the backup's list too */
        for (i = 0; sp.destml && (size_t)i < gone.count; i++) {
            fprintf(stderr, "%s: warning: mailbox %s was removed or renamed "
                    "while the backup ran; it is not in the backup\n",
                    backup_progname, gone.data[i]);
            if (mboxlist_delete(sp.destml, gone.data[i], 0) != STORE_OK)
                failed = 1;
        }
        mboxlist_close(&sp.destml);
        if (sp.failed)
            failed = 1;
    }

    /* 4. quota, seen, subscriptions; 5. plain files */
    backup_join(s, sizeof(s), confdir, QUOTA_FNAME);
    backup_join(d, sizeof(d), destconfdir, QUOTA_FNAME);
    if (!failed && backup_copy_db(s, d) < 0)
        failed = 1;
    if (!failed && backup_copy_user_dbs(confdir, destconfdir) < 0)
        failed = 1;
    for (i = 0; !failed && backup_plain_files[i]; i++) {
        backup_join(s, sizeof(s), confdir, backup_plain_files[i]);
        backup_join(d, sizeof(d), destconfdir, backup_plain_files[i]);
        unlink(d);
        if (backup_copy_file(s, d) < 0 && errno != ENOENT) {
            fprintf(stderr, "%s: copy %s: %s\n", backup_progname, s,
                    strerror(errno));
            failed = 1;
        }
    }
    if (!failed && (fs_fsync_dir(destconfdir) < 0
                    || backup_write_marker(destdir, started, sp.mailboxes,
                                           sp.messages) < 0)) {
        fprintf(stderr, "%s: %s: %s\n", backup_progname, destdir,
                strerror(errno));
        failed = 1;
    }
    strarray_fini(&gone);
    imapconf_free(&destconf);
    if (failed) {
        fprintf(stderr, "%s: backup into %s failed: it is incomplete\n",
                backup_progname, destdir);
        return BACKUP_EXIT_FAIL;
    }
    backup_say("backup done dir=%s mailboxes=%lu messages=%lu", destdir,
               sp.mailboxes, sp.messages);
    return BACKUP_EXIT_OK;
}

struct backup_restore {
    const struct imapconf *conf;
    const char *srcdir;
    int failed;
};

static int backup_restore(const struct imapconf *conf, const char *srcdir)
{
    const char *confdir = imapconf_getstring(conf, "configdirectory");
    char path[PATH_MAX];
    struct dirent *de;
    struct stat st;
    DIR *d;
    int failed = 0;

    backup_join(path, sizeof(path), srcdir, BACKUP_MARKER);
    if (stat(path, &st) < 0) {
        fprintf(stderr, "%s: %s is not a complete backup (no %s)\n",
                backup_progname, srcdir, BACKUP_MARKER);
        return BACKUP_EXIT_FAIL;
    }
    if (!confdir || !*confdir) {
        fprintf(stderr, "%s: configdirectory is not set\n", backup_progname);
        return BACKUP_EXIT_FAIL;
    }
    backup_join(path, sizeof(path), confdir, MBOXLIST_FNAME);
    if (stat(path, &st) == 0) {
        fprintf(stderr, "%s: %s exists: restore only into a fresh "
                "configdirectory\n", backup_progname, path);
        return BACKUP_EXIT_FAIL;
    }
    /* partitions first: every one must be configured and empty */
    backup_join(path, sizeof(path), srcdir, BACKUP_PARTITION_SUBDIR);
    d = opendir(path);
    while (d && (de = readdir(d)) != NULL) {
        char part[PATH_MAX];
        const char *root;

        if (de->d_name[0] == '.')
            continue;
        root = imapconf_partition(conf, de->d_name);
        if (!root) {
            fprintf(stderr, "%s: the backup has partition %s, imapd.conf "
                    "has no partition-%s\n", backup_progname, de->d_name,
                    de->d_name);
            failed = 1;
            break;
        }
        if (backup_dir_empty(root) != 1) {
            fprintf(stderr, "%s: partition-%s %s is not empty: restore "
                    "only into fresh partitions\n", backup_progname,
                    de->d_name, root);
            failed = 1;
            break;
        }
        backup_join(part, sizeof(part), path, de->d_name);
        if (backup_copy_tree(part, root) < 0) {
            failed = 1;
            break;
        }
        backup_say("restored partition %s into %s", de->d_name, root);
    }
    if (d)
        closedir(d);
    if (!failed) {
        backup_join(path, sizeof(path), srcdir, BACKUP_CONFIG_SUBDIR);
        if (backup_copy_tree(path, confdir) < 0)
            failed = 1;
        else
            backup_say("restored databases into %s", confdir);
    }
    if (failed) {
        fprintf(stderr, "%s: restore from %s failed\n", backup_progname,
                srcdir);
        return BACKUP_EXIT_FAIL;
    }
    backup_say("restore done: run ctl_cyrusdb -r (the master's START does), "
               "then mbtool check -a");
    return BACKUP_EXIT_OK;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { "restore", no_argument, NULL, 'r' },
        { "test-order", required_argument, NULL, 'O' },
        { "test-hook", required_argument, NULL, 'H' },
        { NULL, 0, NULL, 0 }
    };
    const char *config = BACKUP_DEFAULT_CONFIG, *perr = NULL;
    struct imapconf *conf = NULL;
    char *err = NULL;
    int opt, restore = 0, ret;

    if (argv[0])
        backup_progname = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1
                                                : argv[0];
    log_init(backup_progname, LOG_TO_STDERR);
    log_set_info(0);
    while ((opt = getopt_long(argc, argv, "C:qrh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': config = optarg; break;
        case 'q': backup_quiet = 1; break;
        case 'r': restore = 1; break;
        case 'h': backup_usage(stdout); return BACKUP_EXIT_OK;
        case 'O':
            if (strcmp(optarg, "files-first") != 0)
                return backup_usage_error("--test-order takes files-first");
            backup_files_first = 1;
            break;
        case 'H': backup_hook = optarg; break;
        default: return backup_usage_error("unknown option");
        }
    }
    if (optind + 1 != argc)
        return backup_usage_error(restore ? "one SRCDIR expected"
                                          : "one DESTDIR expected");
    if (imapconf_load(config, &conf, &err) != 0) {
        fprintf(stderr, "%s: %s\n", backup_progname,
                err ? err : "out of memory");
        free(err);
        return BACKUP_EXIT_FAIL;
    }
    if (privs_drop_to_cyrus_user(conf, &perr) != PRIVS_OK) {
        fprintf(stderr, "%s: %s\n", backup_progname, perr);
        imapconf_free(&conf);
        return BACKUP_EXIT_FAIL;
    }
    ret = restore ? backup_restore(conf, argv[optind])
                  : backup_run(conf, argv[optind]);
    imapconf_free(&conf);
    return ret;
}
