/*
 * mboxlist.h - the mailbox list: CONFIGDIR/mailboxes.db.
 *
 * One record per mailbox, keyed by the internal name (see mboxname.h),
 * in the cyrusdb backend `mboxlist_db` names, always opened with
 * CYRUSDB_MBOXSORT so that a mailbox's children follow it in a walk.
 * Value (our format, one line of text):
 *
 *     TYPE SP PARTITION SP UNIQUEID SP ACL
 *
 * TYPE is one letter ('e': an ordinary mailbox), PARTITION a configured
 * partition name, UNIQUEID 24 lower-case hex digits (random, fixed for the
 * mailbox's life, surviving rename; the key of seen state), ACL Cyrus's
 * "ID<TAB>RIGHTS<TAB>..." string (acl.h), possibly empty.
 *
 * The list and the spool agree through ordering, not a shared transaction:
 *   create: under the database write lock (cyrusdb_fetchlock on the name),
 *           the spool directory and an empty index are made and synced
 *           first, then the entry is committed.  A crash in between leaves
 *           a spool directory without an entry, which the next create of
 *           that name replaces.  An entry never points at nothing.
 *   delete: the entry is deleted and committed first, then the spool
 *           directory removed.  A crash in between leaves an orphan
 *           directory (harmless, as above).
 *   rename: spool directories are renamed first (rename(2), same
 *           partition), then one transaction deletes the old entries and
 *           creates the new ones.  A crash in between leaves entries
 *           pointing at missing directories: mailbox_open() reports
 *           STORE_NOTFOUND, and `mbtool reconstruct` (or renaming back)
 *           repairs it.  Cross-partition rename is STORE_NOTIMPLEMENTED.
 *
 * Handles are per process: open after fork().
 */
#ifndef STORE_MBOXLIST_H
#define STORE_MBOXLIST_H

#include "lib/buf.h"
#include "lib/imapconf.h"

#define MBOXLIST_FNAME "mailboxes.db"
#define MBOXLIST_TYPE_EMAIL 'e'

struct mboxlist;   /* an open mailbox list: opaque */

struct mboxlist_entry {
    char *name;        /* internal name */
    char *partition;
    char *uniqueid;
    char *acl;
    char type;
};

/* Open CONFIGDIR/mailboxes.db (created when missing) with the backend from
 * conf.  conf must outlive the handle.  STORE_OK, STORE_IOERROR,
 * STORE_NOMEM. */
int mboxlist_open(const struct imapconf *conf, struct mboxlist **ml_r);
void mboxlist_close(struct mboxlist **mlp);

/* Look a name up.  On STORE_OK *entry_r is a new entry the caller frees
 * with mboxlist_entry_free(); STORE_NOTFOUND, STORE_BADNAME (name invalid),
 * STORE_IOERROR, STORE_CORRUPT (the stored value does not parse). */
int mboxlist_lookup(struct mboxlist *ml, const char *name,
                    struct mboxlist_entry **entry_r);
void mboxlist_entry_free(struct mboxlist_entry **ep);

/* Create a mailbox: the entry and its spool (mailbox_create()).
 * partition NULL = defaultpartition; acl NULL = for "user.U[.X]" names
 * "U<TAB>lrswipkxtea<TAB>", for other names "" (only admins).  On
 * STORE_OK the new unique id is copied into uniqueid_r when not NULL.
 * STORE_EXISTS, STORE_BADNAME, STORE_BADPARTITION, STORE_IOERROR,
 * STORE_NOSPACE, STORE_NOMEM. */
int mboxlist_create(struct mboxlist *ml, const char *name,
                    const char *partition, const char *acl,
                    struct buf *uniqueid_r);

#define MBOXLIST_RECURSIVE 1   /* delete/rename children too */

/* Delete a mailbox (with MBOXLIST_RECURSIVE also every mailbox below it)
 * and its spool.  Without the flag, a mailbox with children is deleted
 * alone (its children stay, as IMAP DELETE does).  Quota roots are not
 * touched (quota.h).  STORE_NOTFOUND, STORE_IOERROR, ... */
int mboxlist_delete(struct mboxlist *ml, const char *name, int flags);

/* Rename `oldname` and every mailbox below it to `newname` (children keep
 * their relative names), moving spool directories; unique ids and ACLs
 * stay.  STORE_NOTFOUND (old), STORE_EXISTS (new or one of the new child
 * names exists), STORE_BADNAME (either name, or new below old),
 * STORE_NOTIMPLEMENTED (a mailbox of the tree is on another partition
 * than `newpartition`, when given), STORE_IOERROR. */
int mboxlist_rename(struct mboxlist *ml, const char *oldname,
                    const char *newname, const char *newpartition);

/* Replace the ACL string of a mailbox (checked with acl_check()). */
int mboxlist_setacl(struct mboxlist *ml, const char *name, const char *acl);

/* Call cb for every mailbox whose internal name matches the IMAP pattern
 * (mboxname_match with '.' as separator), in mailbox order.  The entry
 * passed is valid only during the call.  cb returning non-zero stops the
 * walk and that value is returned.  The walk reads a consistent snapshot
 * where the backend gives one; cb must not modify the list.  STORE_OK,
 * STORE_IOERROR, or cb's value. */
typedef int mboxlist_cb_fn(void *rock, const struct mboxlist_entry *entry);
int mboxlist_list(struct mboxlist *ml, const char *pattern,
                  mboxlist_cb_fn *cb, void *rock);

/* The conf the list was opened with (for callers that need paths). */
const struct imapconf *mboxlist_conf(const struct mboxlist *ml);

#endif
