/*
 * imapcmd.h - what session.c offers the files that hold a family of
 * commands (aclcmd.c: RFC 4314 ACL; quotacmd.c: RFC 9208 QUOTA).  Not a
 * public interface: only imapd's own files include it.
 *
 * A command function is called by session.c's dispatcher with the parsed
 * command (imap_cmd_args()) in the authenticated or selected state.  It
 * answers with exactly one imap_reply() / imap_reply_store_error() /
 * imap_name_arg() failure; untagged lines go through imap_prot() before
 * that.  Every function here is for the session's one thread; none
 * exits or blocks on anything but the store's locks.
 */
#ifndef IMAPD_IMAPCMD_H
#define IMAPD_IMAPCMD_H

#include "imapd/imapparse.h"
#include "lib/buf.h"
#include "lib/imapconf.h"
#include "store/mboxlist.h"
#include "store/userid.h"

struct imap_session;
struct prot;

/* The parsed command, the stream, the configuration. */
const struct imapparse_cmd *imap_cmd_args(const struct imap_session *s);
struct prot *imap_prot(const struct imap_session *s);
const struct imapconf *imap_conf(const struct imap_session *s);
const struct userid_policy *imap_policy(const struct imap_session *s);
/* The logged-in user id (internal form) and its domain (NULL: none). */
const char *imap_userid(const struct imap_session *s);
const char *imap_user_domain(const struct imap_session *s);
/* The mailbox list (opening it if an earlier open failed), or NULL. */
struct mboxlist *imap_mboxlist(struct imap_session *s);

/* The tagged reply ("OK", "NO", "BAD"); the selected mailbox's updates
 * go first, as for every command. */
void imap_reply(struct imap_session *s, const char *status,
                const char *fmt, ...) __attribute__((format(printf, 3, 4)));
/* "NO [CODE] text" for a STORE_* error. */
void imap_reply_store_error(struct imap_session *s, int r);
/* A string as an IMAP quoted string (names and ids: no CR/LF/NUL). */
void imap_put_quoted(struct prot *p, const char *str);

/* cmd.arg[i] (a mailbox name as the client writes it) into the
 * internal name in out.  0, or -1 after answering NO [CANNOT]. */
int imap_name_arg(struct imap_session *s, int i, struct buf *out);
/* Internal name -> the client's name.  STORE_OK, STORE_BADNAME. */
int imap_to_external(struct imap_session *s, const char *name,
                     struct buf *out);
/* Look a mailbox up for an operation needing `need` rights: STORE_OK
 * and *e_r (free with mboxlist_entry_free), STORE_NOTFOUND (also when
 * the user has no l right, or the name is in another domain),
 * STORE_PERMISSION, or a store error. */
int imap_lookup(struct imap_session *s, const char *name, int need,
                struct mboxlist_entry **e_r);
/* The session's rights on mailbox `name` with ACL `acl` (admins
 * counted where the user administers). */
int imap_rights(struct imap_session *s, const char *name, const char *acl);
/* May the session use admin rights on `name`?  1 or 0. */
int imap_admin_for(const struct imap_session *s, const char *name);
/* Is the name in reach of the session (its domain; every domain for a
 * global admin)?  1 or 0. */
int imap_reachable(const struct imap_session *s, const char *name);
/* The canonical `admins` list (what acl_rights() takes). */
const char *imap_admins(const struct imap_session *s);
/* The user's own INBOX ("user.U"), "" when the login has none. */
const char *imap_inbox(const struct imap_session *s);

#endif
