/*
 * imapcmd.h - what session.c offers the files that hold a family of
 * commands (aclcmd.c: RFC 4314 ACL; quotacmd.c: RFC 9208 QUOTA;
 * appendcmd.c: APPEND).  Not a public interface: only imapd's own files
 * include it.
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
#include "lib/strarray.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/userid.h"

struct imap_session;
struct prot;
struct message;
struct appendcmd;

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

/* ---- for APPEND (appendcmd.c) ---- */

/* The largest message APPEND takes (APPENDLIMIT), and the parser's
 * bound on a message literal. */
size_t imap_append_limit(const struct imap_session *s);
size_t imap_max_append(const struct imap_session *s);
/* Read the APPEND's next event into the command (imapparse_append_next,
 * with its IMAPPARSE_* result). */
int imap_append_next(struct imap_session *s);
/* The APPEND whose data is being read (NULL: none), for the
 * continuation callback; how that callback refused the command's data
 * (0 not, 1 with a NO, 2 with a BAD). */
void imap_set_append(struct imap_session *s, struct appendcmd *a);
int imap_append_refused(const struct imap_session *s);
/* Count n messages stored (the session's summary log line). */
void imap_count_appended(struct imap_session *s, size_t n);
/* End the session after this command; reason (NULL: keep the one set)
 * goes into its log line. */
void imap_end_session(struct imap_session *s, const char *reason);
/* Was UTF8=ACCEPT enabled (RFC 6855)? */
int imap_utf8_accepted(const struct imap_session *s);
/* The servername this server answers for. */
const char *imap_servername(const struct imap_session *s);
/* The selected mailbox, NULL outside the selected state. */
struct mailbox *imap_selected_mailbox(const struct imap_session *s);

/* The destination of APPEND/COPY/MOVE (cmd.arg[0]): looked up with the
 * i right and opened.  STORE_OK, or an error answered here (NO
 * [TRYCREATE] for a missing mailbox) when answer is set. */
int imap_dest_open(struct imap_session *s, int answer,
                   struct mboxlist_entry **e_r, struct mailbox **mb_r);
/* A mailbox name as the client writes it into the internal one
 * (STORE_OK, STORE_BADNAME with *err_r); without one trailing
 * separator. */
int imap_to_internal(struct imap_session *s, const char *ext,
                     struct buf *out, const char **err_r);
const char *imap_strip_sep(struct imap_session *s, const char *ext,
                           struct buf *tmp);
/* Does mailbox mb keep \Seen in the seen state (it has a unique id)? */
int imap_mb_useseen(struct mailbox *mb);
/* Add uids[0..n-1] to the user's seen state of mb (logged on error). */
void imap_seen_add_uids(struct imap_session *s, struct mailbox *mb,
                        const uint32_t *uids, size_t n);
/* A compact set text ("1:3,7") being built: *prev the last number added
 * (0 at the start), *run whether a range is open; imap_set_end() closes
 * it. */
void imap_set_add(struct buf *out, uint32_t n, uint32_t *prev, int *run);
void imap_set_end(struct buf *out, uint32_t prev, int run);
/* Find and read the record of a uid under the lock: STORE_OK, or
 * STORE_NOTFOUND when it is gone (also when expunged). */
int imap_read_uid(struct imap_session *s, struct mailbox *mb,
                  uint32_t uid, uint32_t *recno_r,
                  struct mailbox_record *rec);
/* A message file read or mapped, and parsed (store/message.h): a file
 * below IMAP_MSGFILE_READ bytes is read into memory with one pread (no
 * fstat, mmap and munmap for the usual message), a larger one mapped. */
#define IMAP_MSGFILE_READ 65536
struct imap_msgfile {
    int fd;
    void *base;
    size_t len;
    int mapped;         /* base is a mapping (else malloc'd, or NULL) */
    struct message *msg;
};
int imap_msgfile_open(struct mailbox *mb, uint32_t uid,
                      struct imap_msgfile *mf);
void imap_msgfile_close(struct imap_msgfile *mf);
/* The keywords of a flag list (the names not starting with a
 * backslash) into out; the system flags of an APPEND flag list (unknown
 * \flags ignored); those a user with `rights` may set on a new
 * message. */
void imap_keyword_names(const char *const *names, size_t n,
                        struct strarray *out);
uint32_t imap_sysflags_of(const struct imapparse_strlist *l);
uint32_t imap_settable(int rights);
/* After STORE_OVERQUOTA from a strict append: did the keyword limit
 * refuse it (mb has all its keywords in use and one of kws is not among
 * them)? */
int imap_keywords_undefined(struct mailbox *mb, const struct strarray *kws);

#endif
