/*
 * dbcheck.c - the store's database files against the configured backends
 * (see dbcheck.h).
 *
 * The table below is the one list of which key goes with which file; the
 * per-user files are found by walking CONFIGDIR/user/H/.  Read-only: only
 * headers are read (cyrusdb_detect()), so it may run beside a live
 * server and as any user that can read the directory.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <string.h>
#include <sys/stat.h>

#include "cyrusdb/cyrusdb.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/log.h"
#include "store/dbcheck.h"
#include "store/duplicate.h"
#include "store/mboxlist.h"
#include "store/quota.h"

/* The store's databases: a file in CONFIGDIR, or (per user, fname NULL)
 * every CONFIGDIR/user/H/NAME.SUFFIX. */
static const struct {
    const char *key;
    const char *fname;
    const char *suffix;
    int mboxsort;
} dbcheck_dbs[] = {
    { .key = "mboxlist_db", .fname = MBOXLIST_FNAME, .suffix = NULL,
      .mboxsort = CYRUSDB_MBOXSORT },
    { .key = "duplicate_db", .fname = DUPLICATE_FNAME, .suffix = NULL,
      .mboxsort = 0 },
    { .key = "quota_db", .fname = QUOTA_FNAME, .suffix = NULL,
      .mboxsort = CYRUSDB_MBOXSORT },
    { .key = "seenstate_db", .fname = NULL, .suffix = ".seen",
      .mboxsort = 0 },
    { .key = "subscription_db", .fname = NULL, .suffix = ".sub",
      .mboxsort = CYRUSDB_MBOXSORT },
};

#define DBCHECK_NDBS (sizeof(dbcheck_dbs) / sizeof(dbcheck_dbs[0]))

/* Check one file; 1 when it is a mismatch (reported), else 0. */
static int dbcheck_file(size_t i, const char *backend, const char *fname,
                        dbcheck_report_fn *report, void *rock)
{
    const struct cyrusdb_registry_entry *e = cyrusdb_lookup(backend);
    struct dbcheck_mismatch m;
    const char *format = NULL;
    struct stat st;
    int r;

    if (stat(fname, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size == 0)
        return 0;   /* missing or empty: made on first use */
    r = cyrusdb_detect(fname, &format);
    if (r == CYRUSDB_NOTFOUND)
        return 0;
    if (r == CYRUSDB_BADFORMAT)
        format = "unknown";
    else if (r != CYRUSDB_OK)
        format = "unreadable";
    else if (e && !strcmp(e->format, format))
        return 0;
    m.key = dbcheck_dbs[i].key;
    m.fname = fname;
    m.configured = backend;
    m.found = format;
    m.mboxsort = dbcheck_dbs[i].mboxsort;
    if (report)
        report(rock, &m);
    return 1;
}

/* Every CONFIGDIR/user/H/NAME ending in suffix. */
static int dbcheck_user_files(const char *confdir, size_t i,
                              const char *backend, dbcheck_report_fn *report,
                              void *rock)
{
    const char *suffix = dbcheck_dbs[i].suffix;
    size_t slen = strlen(suffix);
    struct buf dir = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct dirent *h, *f;
    DIR *top, *sub;
    int n = 0;

    if (buf_printf(&dir, "%s/user", confdir) < 0)
        return -1;
    top = opendir(buf_cstring(&dir));
    if (!top) {
        buf_free(&dir);
        return 0;
    }
    while ((h = readdir(top)) != NULL) {
        if (h->d_name[0] == '.')
            continue;
        buf_reset(&path);
        buf_printf(&path, "%s/%s", buf_cstring(&dir), h->d_name);
        sub = opendir(buf_cstring(&path));
        if (!sub)
            continue;
        while ((f = readdir(sub)) != NULL) {
            size_t len = strlen(f->d_name);
            struct buf file = BUF_INITIALIZER;

            if (len <= slen || strcmp(f->d_name + len - slen, suffix) != 0)
                continue;
            if (buf_printf(&file, "%s/%s", buf_cstring(&path),
                           f->d_name) < 0) {
                n = -1;
                break;
            }
            n += dbcheck_file(i, backend, buf_cstring(&file), report, rock);
            buf_free(&file);
        }
        closedir(sub);
        if (n < 0)
            break;
    }
    closedir(top);
    buf_free(&dir);
    buf_free(&path);
    return n;
}

int dbcheck_backends(const struct imapconf *conf, dbcheck_report_fn *report,
                     void *rock)
{
    const char *confdir = imapconf_getstring(conf, "configdirectory");
    struct buf path = BUF_INITIALIZER;
    int n = 0, k;
    size_t i;

    if (!confdir || !*confdir) {
        log_error("dbcheck: configdirectory is not set");
        return -1;
    }
    for (i = 0; i < DBCHECK_NDBS; i++) {
        const char *backend = imapconf_getstring(conf, dbcheck_dbs[i].key);

        if (!backend)
            continue;
        if (dbcheck_dbs[i].fname) {
            buf_reset(&path);
            if (buf_printf(&path, "%s/%s", confdir, dbcheck_dbs[i].fname) < 0) {
                buf_free(&path);
                return -1;
            }
            n += dbcheck_file(i, backend, buf_cstring(&path), report, rock);
        } else {
            k = dbcheck_user_files(confdir, i, backend, report, rock);
            if (k < 0) {
                buf_free(&path);
                return -1;
            }
            n += k;
        }
    }
    buf_free(&path);
    return n;
}

int dbcheck_advice(const struct dbcheck_mismatch *m, const char *confpath,
                   const char *cvt_path, struct buf *out)
{
    const char *cvt = cvt_path ? cvt_path : "cvt_cyrusdb";
    int r = 0;

    if (!strcmp(m->found, "unreadable"))
        return buf_printf(out, "%s (%s: %s) cannot be read: check its "
                          "owner and mode", m->fname, m->key, m->configured);
    if (!strcmp(m->found, "unknown"))
        return buf_printf(out, "%s is not a database file of any known "
                          "backend, but %s is %s: the file is damaged or "
                          "not a database; move it away (the server makes "
                          "a new one) or restore it from a backup",
                          m->fname, m->key, m->configured);
    r |= buf_printf(out, "%s is in %s format, but %s is %s%s%s: the server "
                    "cannot open it.  ", m->fname, m->found, m->key,
                    m->configured, confpath ? " in " : "",
                    confpath ? confpath : "");
    if (!cyrusdb_lookup(m->found)) {
        r |= buf_printf(out, "This build cannot read %s files: convert it "
                        "with Cyrus's own cvt_cyrusdb to %s first", m->found,
                        m->configured);
        return r < 0 ? -1 : 0;
    }
    r |= buf_printf(out, "With the master stopped, convert it (as root or "
                    "as cyrus_user; the tool acts as the file's owner): "
                    "%s%s%s%s %s %s %s.new %s && mv %s.new %s",
                    cvt, confpath ? " -C " : "", confpath ? confpath : "",
                    m->mboxsort ? " -M" : "", m->fname, m->found, m->fname,
                    m->configured, m->fname, m->fname);
    if (!strcmp(cyrusdb_lookup(m->configured) ?
                cyrusdb_lookup(m->configured)->format : "", "lmdb"))
        r |= buf_printf(out, " && rm -f %s.new-lock", m->fname);
    r |= buf_printf(out, "  -- or set \"%s: %s\" to keep the file as it is",
                    m->key, m->found);
    return r < 0 ? -1 : 0;
}
