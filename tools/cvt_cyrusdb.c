/*
 * cvt_cyrusdb.c - copy every record of a database into a new database,
 * usually of another backend, and prove the copy equal.
 *
 *   cvt_cyrusdb [-C imapd.conf] [-M] [-f] OLDFILE OLDBACKEND NEWFILE NEWBACKEND
 *
 * The old file is opened read-only; the new one is created and filled in
 * ONE transaction, so a failed conversion commits nothing.  After the
 * commit both files are read back and compared:
 *   1. walk the new file: its keys must come in strictly increasing order,
 *      and each must be in the old file with the very same value bytes;
 *   2. walk the old file: its keys must come in strictly increasing order,
 *      and each must be in the new file;
 *   3. the two walks must count the same number of records.
 * Together these prove the same set of keys, walked in the same order,
 * with the same values, without holding either database in memory.  On any
 * failure after the new file was created, it is removed and the exit
 * status is 1.  OLDFILE's key order is checked before anything is copied
 * (cyrusdb_detect_order(): a file in the other order is refused, exit 2).
 * Started as root it acts as the owner of NEWFILE's directory.
 */
#include "config.h"

#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/cyrusdb_etcd.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "lib/privs.h"

#define CVT_EXIT_OK 0
#define CVT_EXIT_ERROR 1
#define CVT_EXIT_USAGE 2

static const char *cvt_progname = "cvt_cyrusdb";

static void cvt_usage(FILE *out)
{
    fprintf(out,
"Usage: %s [-C imapd.conf] [-M] [-f] OLDFILE OLDBACKEND NEWFILE NEWBACKEND\n"
"\n"
"Copy every record of the database OLDFILE (written by OLDBACKEND) into a\n"
"new database NEWFILE of backend NEWBACKEND, in one transaction, then read\n"
"both back and check that they hold the same keys in the same order with\n"
"the same values.  OLDFILE is only read.\n"
"Backends: %s\n"
"\n"
"Options:\n"
"  -C FILE   read this imapd.conf (checked for errors only)\n"
"  -M        mailbox-name order ('.' sorts before every other byte), for\n"
"            databases kept in that order (mailboxes.db)\n"
"  -f        replace NEWFILE if it exists (by default an existing NEWFILE\n"
"            is refused)\n"
"  -h, --help  this text\n"
"\n"
"OLDFILE is checked for its key order first: one that is consistent only in\n"
"the other order is refused with a message saying so (exit 2).  Started as\n"
"root, the tool acts as the owner of NEWFILE's directory (unless that is\n"
"root), so that the new file is the server's.\n"
"On success prints the number of records copied and verified.  If the\n"
"conversion or the verification fails, NEWFILE is removed.\n"
"Exit status: 0 success, 1 error (message on stderr), 2 usage error.\n"
"Example:\n"
"  %s /var/imap/mailboxes.db flat /var/imap/mailboxes.db.new skiplist\n",
            cvt_progname, cyrusdb_names(), cvt_progname);
}

static void cvt_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

static void cvt_fail(const char *fmt, ...)
{
    va_list ap;

    fprintf(stderr, "%s: ", cvt_progname);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
}

/* ---- copying ------------------------------------------------------------ */

struct cvt_copy {
    struct cyrusdb *newdb;
    struct cyrusdb_txn *tid;
    unsigned long count;
    int r;                 /* the store error that stopped the walk */
};

static int cvt_copy_cb(void *rock, const char *key, size_t keylen,
                       const char *data, size_t datalen)
{
    struct cvt_copy *c = rock;

    c->r = cyrusdb_store(c->newdb, key, keylen, data, datalen, &c->tid);
    if (c->r != CYRUSDB_OK)
        return c->r;
    c->count++;
    return 0;
}

/* ---- verification ------------------------------------------------------- */

/* A key for messages: printable ASCII as is, other bytes and the backslash
 * as \xNN (cyr_dbtool -x reads that form back), cut after 100 bytes. */
static const char *cvt_showkey(const char *key, size_t keylen, char *out,
                               size_t outlen)
{
    size_t i, n = 0;

    for (i = 0; i < keylen && i < 100 && n + 5 < outlen; i++) {
        unsigned char c = (unsigned char)key[i];
        if (c < 0x20 || c >= 0x7f || c == '\\')
            n += (size_t)snprintf(out + n, outlen - n, "\\x%02x", c);
        else
            out[n++] = (char)c;
    }
    if (i < keylen && n + 4 < outlen) {
        memcpy(out + n, "...", 3);
        n += 3;
    }
    out[n] = '\0';
    return out;
}

struct cvt_verify {
    struct cyrusdb *other;     /* the database each record is looked up in */
    const char *name;          /* the walked file, for messages */
    const char *othername;
    int flags;                 /* key order */
    int compare_values;
    struct buf prev;           /* the previous key of the walk */
    int have_prev;
    unsigned long count;
    int failed;
};

static int cvt_verify_cb(void *rock, const char *key, size_t keylen,
                         const char *data, size_t datalen)
{
    struct cvt_verify *v = rock;
    const char *odata = NULL;
    size_t odatalen = 0;
    char shown[512];
    int r;

    cvt_showkey(key, keylen, shown, sizeof(shown));
    if (v->have_prev &&
        cyrusdb_compare(v->flags, v->prev.s, v->prev.len, key, keylen) >= 0) {
        char prevshown[512];
        cvt_fail("verify: %s: key <%s> comes after key <%s>: wrong order",
                 v->name, shown,
                 cvt_showkey(v->prev.s, v->prev.len, prevshown, sizeof(prevshown)));
        v->failed = 1;
        return 1;
    }
    buf_setmap(&v->prev, key, keylen);
    v->have_prev = 1;
    v->count++;

    /* `data` stays valid: the lookup is on the other handle */
    r = cyrusdb_fetch(v->other, key, keylen, &odata, &odatalen, NULL);
    if (r == CYRUSDB_NOTFOUND) {
        cvt_fail("verify: key <%s> is in %s but not in %s", shown, v->name,
                 v->othername);
        v->failed = 1;
        return 1;
    }
    if (r != CYRUSDB_OK) {
        cvt_fail("verify: %s: fetch key <%s>: %s", v->othername, shown,
                 cyrusdb_strerror(r));
        v->failed = 1;
        return 1;
    }
    if (v->compare_values &&
        (odatalen != datalen || (datalen && memcmp(odata, data, datalen)))) {
        cvt_fail("verify: key <%s>: the value differs between %s (%zu bytes) "
                 "and %s (%zu bytes)", shown, v->name, datalen, v->othername,
                 odatalen);
        v->failed = 1;
        return 1;
    }
    return 0;
}

/* Walk `walked`, looking each record up in `other`.  Returns 0 and the
 * record count, or -1 (message printed). */
static int cvt_verify_walk(struct cyrusdb *walked, const char *name,
                           struct cyrusdb *other, const char *othername,
                           int flags, int compare_values,
                           unsigned long *count_r)
{
    struct cvt_verify v = {
        .other = other, .name = name, .othername = othername,
        .flags = flags, .compare_values = compare_values,
        .prev = BUF_INITIALIZER, .have_prev = 0, .count = 0, .failed = 0
    };
    int r = cyrusdb_foreach(walked, NULL, 0, NULL, cvt_verify_cb, &v, NULL);

    buf_free(&v.prev);
    if (v.failed)
        return -1;
    if (r != CYRUSDB_OK) {
        cvt_fail("verify: %s: walk failed: %s", name, cyrusdb_strerror(r));
        return -1;
    }
    *count_r = v.count;
    return 0;
}

/* ---- main --------------------------------------------------------------- */

/* Remove a new file that failed; LMDB keeps its lock table beside the
 * data file, in FILE-lock, which goes too. */
static void cvt_remove(const char *fname, const char *backend)
{
    const struct cyrusdb_registry_entry *e = cyrusdb_lookup(backend);

    if (unlink(fname) < 0 && errno != ENOENT)
        cvt_fail("%s: cannot remove: %s", fname, strerror(errno));
    else
        cvt_fail("%s: removed", fname);
    if (e && !strcmp(e->format, "lmdb")) {
        struct buf lock = BUF_INITIALIZER;
        buf_printf(&lock, "%s-lock", fname);
        if (unlink(buf_cstring(&lock)) < 0 && errno != ENOENT)
            cvt_fail("%s: cannot remove: %s", buf_cstring(&lock), strerror(errno));
        buf_free(&lock);
    }
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        { "help", no_argument, NULL, 'h' },
        { "force", no_argument, NULL, 'f' },
        { "mboxsort", no_argument, NULL, 'M' },
        { NULL, 0, NULL, 0 }
    };
    const char *config = NULL, *oldfile, *oldbackend, *newfile, *newbackend;
    const char *err = NULL;
    struct cyrusdb *olddb = NULL, *newdb = NULL;
    struct cvt_copy copy = { .newdb = NULL, .tid = NULL, .count = 0, .r = 0 };
    unsigned long newcount = 0, oldcount = 0;
    struct stat oldst, newst;
    int mboxsort = 0, force = 0, opt, r;

    log_init(argv[0], LOG_TO_STDERR);
    if (argv[0])
        cvt_progname = strrchr(argv[0], '/') ? strrchr(argv[0], '/') + 1 : argv[0];

    while ((opt = getopt_long(argc, argv, "+C:Mfh", longopts, NULL)) != -1) {
        switch (opt) {
        case 'C': config = optarg; break;
        case 'M': mboxsort = CYRUSDB_MBOXSORT; break;
        case 'f': force = 1; break;
        case 'h': cvt_usage(stdout); return CVT_EXIT_OK;
        default:
            fprintf(stderr, "Try '%s --help' for more information.\n", cvt_progname);
            return CVT_EXIT_USAGE;
        }
    }
    if (argc - optind != 4) {
        cvt_fail("need OLDFILE OLDBACKEND NEWFILE NEWBACKEND");
        fprintf(stderr, "Try '%s --help' for more information.\n", cvt_progname);
        return CVT_EXIT_USAGE;
    }
    oldfile = argv[optind];
    oldbackend = argv[optind + 1];
    newfile = argv[optind + 2];
    newbackend = argv[optind + 3];
    if (!cyrusdb_lookup(oldbackend) || !cyrusdb_lookup(newbackend)) {
        cvt_fail("unknown backend \"%s\" (known: %s)",
                 cyrusdb_lookup(oldbackend) ? newbackend : oldbackend,
                 cyrusdb_names());
        return CVT_EXIT_USAGE;
    }

    if (config) {
        struct imapconf *conf = NULL;
        char *cerr = NULL;
        if (imapconf_load(config, &conf, &cerr) < 0) {
            cvt_fail("%s", cerr ? cerr : config);
            free(cerr);
            return CVT_EXIT_ERROR;
        }
        cyrusdb_etcd_configure(conf);
        imapconf_free(&conf);
    }

    /* started as root: act as the owner of NEWFILE's directory, so that
     * the new file (and a lock file beside it) is not root's */
    if (privs_drop_to_owner(newfile, &err) != PRIVS_OK) {
        cvt_fail("%s", err);
        return CVT_EXIT_ERROR;
    }
    if (access(oldfile, F_OK) == 0) {
        int order = 0;
        if (cyrusdb_detect_order(oldbackend, oldfile, mboxsort, &order)
                == CYRUSDB_OK && order != mboxsort) {
            cvt_fail("%s: this file is in %s order (consistent %s -M, not "
                     "%s it): %s", oldfile, order ? "mailbox" : "byte",
                     order ? "with" : "without", order ? "without" : "with",
                     order ? "use -M" : "leave out -M");
            return CVT_EXIT_USAGE;
        }
    }

    if (stat(newfile, &newst) == 0) {
        if (stat(oldfile, &oldst) == 0 && oldst.st_dev == newst.st_dev &&
            oldst.st_ino == newst.st_ino) {
            cvt_fail("%s and %s are the same file", oldfile, newfile);
            return CVT_EXIT_ERROR;
        }
        if (!force) {
            cvt_fail("%s: already exists; refusing to overwrite it (use -f)",
                     newfile);
            return CVT_EXIT_ERROR;
        }
        if (!S_ISREG(newst.st_mode)) {
            cvt_fail("%s: exists and is not a regular file", newfile);
            return CVT_EXIT_ERROR;
        }
    }

    r = cyrusdb_open(oldbackend, oldfile, CYRUSDB_RDONLY | CYRUSDB_NOCOMPACT | mboxsort,
                     &olddb, &err);
    if (r != CYRUSDB_OK) {
        cvt_fail("%s", err && *err ? err : cyrusdb_strerror(r));
        return CVT_EXIT_ERROR;
    }
    if (force && unlink(newfile) < 0 && errno != ENOENT) {
        cvt_fail("%s: cannot remove: %s", newfile, strerror(errno));
        cyrusdb_close(&olddb);
        return CVT_EXIT_ERROR;
    }
    r = cyrusdb_open(newbackend, newfile, CYRUSDB_CREATE | CYRUSDB_NOCOMPACT | mboxsort,
                     &newdb, &err);
    if (r != CYRUSDB_OK) {
        cvt_fail("%s", err && *err ? err : cyrusdb_strerror(r));
        cyrusdb_close(&olddb);
        cvt_remove(newfile, newbackend);
        return CVT_EXIT_ERROR;
    }

    /* 1. copy, in one transaction on the new file */
    copy.newdb = newdb;
    r = cyrusdb_foreach(olddb, NULL, 0, NULL, cvt_copy_cb, &copy, NULL);
    if (r != CYRUSDB_OK) {
        if (copy.r != CYRUSDB_OK)
            cvt_fail("%s: store failed after %lu records: %s", newfile,
                     copy.count, cyrusdb_strerror(copy.r));
        else
            cvt_fail("%s: reading failed after %lu records: %s", oldfile,
                     copy.count, cyrusdb_strerror(r));
        if (copy.tid)
            cyrusdb_abort(newdb, copy.tid);
        goto fail;
    }
    if (copy.tid) {
        r = cyrusdb_commit(newdb, copy.tid);
        copy.tid = NULL;
        if (r != CYRUSDB_OK) {
            cvt_fail("%s: commit failed: %s", newfile, cyrusdb_strerror(r));
            goto fail;
        }
    }

    /* 2. verify, through a fresh handle that reads what is on disk */
    r = cyrusdb_close(&newdb);
    if (r != CYRUSDB_OK) {
        cvt_fail("%s: close failed: %s", newfile, cyrusdb_strerror(r));
        goto fail;
    }
    r = cyrusdb_open(newbackend, newfile, CYRUSDB_RDONLY | CYRUSDB_NOCOMPACT | mboxsort,
                     &newdb, &err);
    if (r != CYRUSDB_OK) {
        cvt_fail("verify: %s", err && *err ? err : cyrusdb_strerror(r));
        goto fail;
    }
    if (cvt_verify_walk(newdb, newfile, olddb, oldfile, mboxsort, 1, &newcount) < 0 ||
        cvt_verify_walk(olddb, oldfile, newdb, newfile, mboxsort, 0, &oldcount) < 0)
        goto fail;
    if (newcount != oldcount || newcount != copy.count) {
        cvt_fail("verify: record counts differ: %s has %lu, %s has %lu, "
                 "%lu were copied", oldfile, oldcount, newfile, newcount,
                 copy.count);
        goto fail;
    }
    r = cyrusdb_close(&newdb);
    cyrusdb_close(&olddb);
    if (r != CYRUSDB_OK) {
        cvt_fail("%s: close failed: %s", newfile, cyrusdb_strerror(r));
        cvt_remove(newfile, newbackend);
        return CVT_EXIT_ERROR;
    }
    printf("%s: converted %lu records from %s (%s) to %s (%s); verified "
           "%lu records in both\n", cvt_progname, copy.count, oldfile,
           oldbackend, newfile, newbackend, newcount);
    if (fflush(stdout) == EOF)
        return CVT_EXIT_ERROR;
    return CVT_EXIT_OK;

fail:
    cyrusdb_close(&newdb);
    cyrusdb_close(&olddb);
    cvt_remove(newfile, newbackend);
    return CVT_EXIT_ERROR;
}
