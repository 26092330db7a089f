/*
 * layout.h - the on-disk layout version of a configuration directory.
 *
 * CONFIGDIR/cyrusdeliver.version (text, one "key value" per line):
 *   layout 1          the layout of CONFIGDIR and the spool (this file)
 *   index 1           cyrus.index format written (informational)
 *   skiplist 1.2      skiplist file format written (informational)
 * Only "layout" is checked; the other lines say what wrote the store.
 *
 * Layout versions:
 *   1  the mailbox list, the per-user databases in CONFIGDIR/user/H/,
 *      spool directories PARTITION/A/B (hashimapspool: PARTITION/H/A/B),
 *      with virtdomains PARTITION/domain/D/..., CONFIGDIR/
 *      mailboxes.uidvalidity.  The domain/ tree and mailboxes.uidvalidity
 *      came later, but older stores are read as they are (no domain/
 *      tree means no domain mailboxes; a missing mailboxes.uidvalidity
 *      is made at the next create), so they did not change the layout:
 *      an installation without the version file is layout 1 and only
 *      gets the file.
 *
 * Each file format checks its own version when opened: cyrus.index
 * (header slot version), skiplist (header version), cyrus.header (magic
 * line); Berkeley DB and LMDB check theirs.
 */
#ifndef STORE_LAYOUT_H
#define STORE_LAYOUT_H

#include "lib/buf.h"

#define LAYOUT_FNAME "cyrusdeliver.version"
#define LAYOUT_VERSION 1          /* the newest layout this build knows */
#define LAYOUT_INDEX_VERSION 1    /* store/mailbox.c MBX_IDX_VERSION */
#define LAYOUT_SKIPLIST_VERSION "1.2"

enum {
    LAYOUT_OK = 0,          /* current (the file was there or is now written) */
    LAYOUT_UPGRADED = 1,    /* was older, upgraded (the file rewritten) */
    LAYOUT_NEWER = -1,      /* a newer layout: this build must not use it */
    LAYOUT_BAD = -2,        /* the file does not parse */
    LAYOUT_IOERROR = -3,    /* could not read or write the file */
};

/* Read CONFIGDIR's layout version into *version_r (0 when there is no
 * version file).  LAYOUT_OK, LAYOUT_BAD, LAYOUT_IOERROR; *error_r (may be
 * NULL) gets a message for the admin (static until the next call). */
int layout_read(const char *confdir, int *version_r, const char **error_r);

/* At start (ctl_cyrusdb -r): read the version; none = layout 1, the file
 * is written; older ones are upgraded where a path exists; a newer one
 * gives LAYOUT_NEWER with a message naming both versions.  Writes go to
 * a temp file, synced and renamed.  *found_r (may be NULL) gets the
 * version found (0: no file). */
int layout_check(const char *confdir, int *found_r, const char **error_r);

#endif
