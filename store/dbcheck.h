/*
 * dbcheck.h - do the store's database files match the configured backends?
 *
 * Each database of the store has a configuration key naming its backend
 * and a file (or, per user, many files) in the configuration directory:
 *   mboxlist_db      CONFIGDIR/mailboxes.db      (mailbox order)
 *   duplicate_db     CONFIGDIR/deliver.db
 *   quota_db         CONFIGDIR/quotas.db         (mailbox order)
 *   seenstate_db     CONFIGDIR/user/H/USER.seen
 *   subscription_db  CONFIGDIR/user/H/USER.sub   (mailbox order)
 * A key changed without converting its file (mboxlist_db: lmdb over a
 * skiplist mailboxes.db) makes every open of that database fail, so
 * deliveries get 451 and IMAP gets NO; this check finds that before any
 * worker starts (ctl_cyrusdb -r, run by the master's START) and for the
 * configuration check (cyr_info conf-lint).
 *
 * Only the file's header is read (cyrusdb_detect()); nothing is opened
 * or changed, so the check is safe while the server runs.  A missing
 * file is fine (it is created on first use), and so is an empty one.
 */
#ifndef STORE_DBCHECK_H
#define STORE_DBCHECK_H

#include "lib/buf.h"
#include "lib/imapconf.h"

/* One file whose format is not the configured backend's. */
struct dbcheck_mismatch {
    const char *key;         /* the configuration key, "mboxlist_db" */
    const char *fname;       /* the file */
    const char *configured;  /* the backend the key names, "lmdb" */
    const char *found;       /* the format the file has ("skiplist"), or
                                "unknown" when no backend recognises it */
    int mboxsort;            /* the database is kept in mailbox order
                                (CYRUSDB_MBOXSORT or 0) */
};

/* Called once per mismatch; the strings live until the callback returns. */
typedef void dbcheck_report_fn(void *rock, const struct dbcheck_mismatch *m);

/*
 * Check every database file of the configuration `conf`.  Calls report
 * (may be NULL) for each mismatch.  Returns the number of mismatches, or
 * -1 when the check itself could not be done (configdirectory not set,
 * out of memory; logged); unreadable files are counted as mismatches
 * with found = "unreadable".
 */
int dbcheck_backends(const struct imapconf *conf, dbcheck_report_fn *report,
                     void *rock);

/*
 * What to tell the admin about m, appended to out: the file, both
 * backends, and the exact commands that convert the file (cvt_cyrusdb,
 * found at `cvt_path`, or "cvt_cyrusdb" when NULL; with -C confpath when
 * not NULL; with -M for a database in mailbox order), or the
 * configuration line that matches the file as it is.  One paragraph, no
 * trailing newline.  0, or -1 when memory ran out.
 */
int dbcheck_advice(const struct dbcheck_mismatch *m, const char *confpath,
                   const char *cvt_path, struct buf *out);

#endif
