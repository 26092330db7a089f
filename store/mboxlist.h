/*
 * mboxlist.h - the mailbox list: CONFIGDIR/mailboxes.db.
 *
 * One record per mailbox, keyed by the internal name (see mboxname.h),
 * in the cyrusdb backend `mboxlist_db` names, always opened with
 * CYRUSDB_MBOXSORT so that a mailbox's children follow it in a walk.
 * Value (our format, one line of text):
 *
 *     TYPE SP PARTITION SP UNIQUEID SP ACL [LF "specialuse" SP USES]
 *
 * TYPE is one letter ('e': an ordinary mailbox), PARTITION a configured
 * partition name, UNIQUEID 24 lower-case hex digits (random, fixed for the
 * mailbox's life, surviving rename; the key of seen state), ACL Cyrus's
 * "ID<TAB>RIGHTS<TAB>..." string (acl.h), possibly empty, USES the
 * mailbox's special-use attributes (RFC 6154, "\Sent \Drafts"), written
 * only when there are some: entries without are the original format
 * (mboxlist.c has the details and the compatibility argument).
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
 *           STORE_NOTFOUND; repeating the same rename repairs it (a
 *           mailbox whose old directory is gone and whose new one exists
 *           counts as moved).  Cross-partition rename is
 *           STORE_NOTIMPLEMENTED.
 *
 * Handles are per process: open after fork().
 */
#ifndef STORE_MBOXLIST_H
#define STORE_MBOXLIST_H

#include <time.h>

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
    char *specialuse;  /* "\Sent \Drafts", "" for none; never NULL */
    char type;
};

/* Longest attribute name of a special-use list (without the backslash). */
#define MBOXLIST_SPECIALUSE_MAX 64

/* 0 when `uses` is a well-formed special-use list: "" or "\Atom" words
 * separated by single SPs (atom characters of RFC 3501, at most
 * MBOXLIST_SPECIALUSE_MAX each), -1 otherwise (also NULL).  Which
 * attributes are meaningful is the protocol side's business. */
int mboxlist_specialuse_check(const char *uses);

/* Open CONFIGDIR/mailboxes.db (created when missing) with the backend from
 * conf.  conf must outlive the handle.  STORE_OK, STORE_IOERROR,
 * STORE_NOMEM. */
int mboxlist_open(const struct imapconf *conf, struct mboxlist **ml_r);
void mboxlist_close(struct mboxlist **mlp);

/* The change stamp of the mailbox list (cyrusdb_stamp(): now == 0 as
 * the last lookup saw it, now != 0 as it is now): equal stamps mean no
 * entry changed in between.  STORE_OK; STORE_NOTFOUND when the backend
 * cannot tell cheaply (look up again); STORE_IOERROR. */
struct cyrusdb_stamp;
int mboxlist_stamp(struct mboxlist *ml, int now, struct cyrusdb_stamp *st);

/* Look a name up.  On STORE_OK *entry_r is a new entry the caller frees
 * with mboxlist_entry_free(); STORE_NOTFOUND, STORE_BADNAME (name invalid),
 * STORE_IOERROR, STORE_BUSY, STORE_CORRUPT (the stored value does not
 * parse; logged).  An entry whose ACL alone is malformed is returned (and
 * logged): acl_rights() gives it no rights, so it fails closed and an
 * admin can replace it with mboxlist_setacl(). */
int mboxlist_lookup(struct mboxlist *ml, const char *name,
                    struct mboxlist_entry **entry_r);
void mboxlist_entry_free(struct mboxlist_entry **ep);

/* Create a mailbox: the entry and its spool (mailbox_create()).
 * partition NULL = defaultpartition; acl NULL = for "user.U[.X]" names
 * "U<TAB>lrswipkxtea<TAB>" (U the login name: a '^' of the mailbox name
 * is a '.' in it, "user.a^b" belongs to "a.b"), for other names ""
 * (only admins).  On
 * STORE_OK the new unique id is copied into uniqueid_r when not NULL
 * (untouched otherwise).  A spool directory left by a create that crashed
 * before its commit is replaced.  Concurrent creators (any process)
 * serialize on the database write lock; of several creating one name,
 * exactly one gets STORE_OK, the others STORE_EXISTS.
 * STORE_EXISTS, STORE_BADNAME, STORE_BADPARTITION, STORE_IOERROR,
 * STORE_BUSY (the backend kept reporting deadlocks), STORE_NOSPACE,
 * STORE_NOMEM, STORE_INTERNAL (acl given and not well formed by
 * acl_check(): a caller's bug, ACLs are built with acl_set()). */
int mboxlist_create(struct mboxlist *ml, const char *name,
                    const char *partition, const char *acl,
                    struct buf *uniqueid_r);

/* mboxlist_create() with the special-use attributes stored in the same
 * entry (one commit: the mailbox never exists without them).  specialuse
 * NULL or "" = none; one that fails mboxlist_specialuse_check() is
 * STORE_INTERNAL.  Everything else as mboxlist_create(). */
int mboxlist_create_special(struct mboxlist *ml, const char *name,
                            const char *partition, const char *acl,
                            const char *specialuse, struct buf *uniqueid_r);

#define MBOXLIST_RECURSIVE 1   /* delete/rename children too */
#define MBOXLIST_IMMEDIATE 2   /* delete: for good, whatever delete_mode */

/* Deleted mailboxes (imapd.conf delete_mode: delayed), as in Cyrus: a
 * deleted mailbox NAME is renamed (mboxlist_rename(), its spool, unique
 * id, ACL and messages kept) to [DOMAIN!]DELETED.NAME.HEXTIME, HEXTIME
 * the deletion time in seconds since the epoch as upper-case hex
 * (at least 8 digits; +1 s while the name exists).  mboxlist_list() does
 * not show such names unless its pattern starts with "DELETED." (after
 * an optional "DOMAIN!"), so IMAP LIST never does.  cyr_expire -D DAYS
 * removes them for good (MBOXLIST_IMMEDIATE); mbtool undelete renames
 * one back. */
#define MBOXLIST_DELETED_PREFIX "DELETED"
#define MBOXLIST_DELETE_IMMEDIATE 0   /* delete_mode values */
#define MBOXLIST_DELETE_DELAYED 1

/* 1 when an internal name (or pattern) lies in the DELETED. hierarchy. */
int mboxlist_is_deleted(const char *name);
/* The deleted name of `name` deleted at `when`, into out. */
int mboxlist_deleted_name(const char *name, time_t when, struct buf *out);
/* The original name and deletion time of a deleted name: STORE_OK,
 * STORE_BADNAME (not DELETED.NAME.HEX), STORE_NOMEM.  orig_r and when_r
 * may be NULL. */
int mboxlist_deleted_parse(const char *dname, struct buf *orig_r,
                           time_t *when_r);

/* Delete a mailbox (with MBOXLIST_RECURSIVE also every mailbox below it)
 * and its spool.  With delete_mode: delayed and without
 * MBOXLIST_IMMEDIATE, a mailbox that is not already in DELETED. is moved
 * there instead (above); one deleted alone that has children is deleted
 * for good (a move would take the children along).  Without the flag, a mailbox with children is deleted
 * alone (its children stay, as IMAP DELETE does; its directory stays while
 * it holds theirs).  Quota roots are not touched (quota.h).  An entry
 * whose value does not parse is deleted too (its spool, on an unknown
 * partition, is left; logged).  Once the entries are committed the delete
 * has happened: a spool that cannot be removed is logged and left as a
 * harmless orphan, and the result is still STORE_OK.
 * STORE_OK, STORE_NOTFOUND, STORE_BADNAME, STORE_IOERROR, STORE_BUSY,
 * STORE_NOMEM. */
int mboxlist_delete(struct mboxlist *ml, const char *name, int flags);

/* Rename `oldname` and every mailbox below it to `newname` (children keep
 * their relative names), moving spool directories; unique ids, ACLs and
 * partitions stay.  Children on other partitions than their parent, and
 * children whose hashimapspool letter differs from their parent's, are
 * moved each within their own partition.  A new directory that already
 * exists and is in use (it holds the spools of surviving children of a
 * mailbox deleted alone) receives the mailbox's files instead.  Any
 * failure before the commit moves everything back.
 * The name line in cyrus.header is not rewritten (it is informational;
 * the next header write by mailbox.c puts the new name).  Processes that
 * have a mailbox of the tree open keep using the old path: rename is for
 * mailboxes not in use (as in Cyrus, where RENAME locks them; here the
 * caller arranges it).
 * STORE_NOTFOUND (old), STORE_EXISTS (new or one of the new child
 * names exists; also newname == oldname), STORE_BADNAME (either name, a
 * new child name over the limits, or new below old), STORE_BADPARTITION
 * (newpartition not configured), STORE_NOTIMPLEMENTED (a mailbox of the
 * tree is on another partition than `newpartition`, when given),
 * STORE_CORRUPT (an entry of the tree does not parse), STORE_IOERROR,
 * STORE_NOSPACE, STORE_BUSY, STORE_NOMEM. */
int mboxlist_rename(struct mboxlist *ml, const char *oldname,
                    const char *newname, const char *newpartition);

/* Replace the ACL string of a mailbox (checked with acl_check()).
 * STORE_OK, STORE_NOTFOUND, STORE_BADNAME, STORE_CORRUPT (the stored value
 * does not parse), STORE_IOERROR, STORE_BUSY, STORE_NOMEM, STORE_INTERNAL
 * (acl NULL or not well formed: a caller's bug, ACLs are built with
 * acl_set()). */
int mboxlist_setacl(struct mboxlist *ml, const char *name, const char *acl);

/* Replace the special-use attributes of a mailbox ("" removes them); the
 * ACL stays.  Return codes as mboxlist_setacl() (STORE_INTERNAL: the
 * list fails mboxlist_specialuse_check()). */
int mboxlist_setspecialuse(struct mboxlist *ml, const char *name,
                           const char *specialuse);

/* Call cb for every mailbox whose internal name matches the IMAP pattern
 * (mboxname_match with '.' as separator), in mailbox order.  The entry
 * passed is valid only during the call (it is a copy: cb may look names
 * up meanwhile).  cb returning non-zero stops the walk and that value is
 * returned.  The walk reads a consistent snapshot where the backend gives
 * one; cb must not modify the list.  Entries whose value does not parse
 * are skipped (and logged).  STORE_OK, STORE_IOERROR, STORE_NOMEM,
 * STORE_INTERNAL (pattern or cb NULL), or cb's value. */
typedef int mboxlist_cb_fn(void *rock, const struct mboxlist_entry *entry);
int mboxlist_list(struct mboxlist *ml, const char *pattern,
                  mboxlist_cb_fn *cb, void *rock);

/* The conf the list was opened with (for callers that need paths). */
const struct imapconf *mboxlist_conf(const struct mboxlist *ml);

#endif
