/*
 * rcpt.h - LMTP addresses: the reverse- and forward-path syntax of
 * RFC 5321 (section 4.1.2), and the mapping of a recipient to the
 * internal name of the mailbox that receives its mail.
 *
 * Syntax accepted (rcpt_parse_path):
 *   "<" [ "@" domain *( "," "@" domain ) ":" ] local-part "@" domain ">"
 *   "<" local-part ">"                          (no domain: a local user)
 *   "<>"                                        (MAIL FROM only)
 * local-part is a dot-string (atext runs separated by single dots) or a
 * quoted-string (qtext and backslash pairs of printable ASCII); domain is
 * a name of letters, digits, '-' and dots or an address literal "[...]".
 * The angle brackets are required.  Control bytes and spaces outside
 * quotes are refused; so are 8-bit bytes, except with RCPT_UTF8 (the
 * transaction's MAIL carried SMTPUTF8, RFC 6531): then well-formed UTF-8
 * characters above U+007F count as atext, qtext and domain-label
 * characters (RFC 6531 3.3), and malformed UTF-8 is still refused.  A
 * path is at most RCPT_PATH_MAX bytes.
 *
 * Mapping (rcpt_mailbox_names) of LOCAL@DOMAIN:
 *   user            -> "user.USER"                 (the INBOX)
 *   user+detail     -> "user.USER.DETAIL" when it exists and "anyone" has
 *                      the p right there, else the INBOX
 *   +shared.folder  -> "shared.folder" (empty user), which must exist and
 *                      let "anyone" post
 * The local part is split at its first '+'.  lmtp_downcase_rcpt
 * lower-cases USER (never the detail nor the domain, which is lower-cased
 * anyway).  USER and DETAIL are external names: with unixhierarchysep a
 * '.' in USER becomes '^' internally, and DETAIL uses '/' as the
 * separator; without it a '.' in USER is refused (it would name another
 * user's folder) and DETAIL uses '.'.  '!', '/' and '^' in USER are
 * refused.
 * The domain (store/userid.h for the keys):
 *   virtdomains off:     ignored (the MTA decided it is local), as Cyrus;
 *   userid and on:       it must obey the domain rules of
 *                        mboxname_domain_check() (an address literal
 *                        "[...]" or a one-label name does not; then
 *                        RCPT_BADDOMAIN); the names above are then those
 *                        of the domain: "D!user.USER",
 *                        "D!user.USER.DETAIL", "D!shared.folder"; the
 *                        defaultdomain and a recipient without a domain
 *                        map to the domain-less names.  With "on" too a
 *                        recipient without a domain is domain-less: LMTP
 *                        has no server address to take one from (MTAs
 *                        always send one).
 * A domain without any mailbox is simply unknown: 550 5.1.1.
 */
#ifndef LMTPD_RCPT_H
#define LMTPD_RCPT_H

#include <stddef.h>
#include <stdint.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "store/userid.h"

#define RCPT_PATH_MAX 512

/* A parsed path. */
struct rcpt_path {
    struct buf addr;     /* the mailbox as written (quotes kept, source
                            route dropped); "" for the null path <> */
    struct buf local;    /* the local part, unquoted */
    struct buf domain;   /* the domain, "" when none was given */
};

void rcpt_path_init(struct rcpt_path *p);
void rcpt_path_free(struct rcpt_path *p);

#define RCPT_ALLOW_NULL 1    /* accept <> (the reverse-path of MAIL) */
#define RCPT_UTF8 2          /* accept UTF-8 (SMTPUTF8, RFC 6531) */

/* Parse a path at the start of (s, len): leading spaces are skipped, the
 * path runs to its closing '>'.  On success returns 0, fills *p (its
 * buffers replaced) and *used_r (may be NULL) with the bytes consumed, so
 * that ESMTP parameters follow at s + *used_r.  On failure returns -1
 * with *error_r (static text) saying what is wrong; *p is emptied.
 * Never reads past s + len. */
int rcpt_parse_path(const char *s, size_t len, int flags, struct rcpt_path *p,
                    size_t *used_r, const char **error_r);

/* The mailbox names a recipient maps to (pure: no I/O).  policy: the
 * virtdomains policy (NULL: off); (domain, domainlen) the recipient's
 * domain, length 0 for none.  *inbox_r gets the INBOX ("user.USER",
 * "D!user.USER"), or for "+shared.folder" the shared mailbox; *folder_r
 * (may be NULL) gets the +detail folder, or is emptied when there is no
 * detail or the address is a shared one.  Returns 0; -1 (error text in
 * *error_r) when the local part does not name a valid mailbox: empty, an
 * empty user without a detail, a '.' in USER without unixhierarchysep, a
 * '/', '^' or '!', a detail that is not a valid name, a name over the
 * length limits; RCPT_NAMES_BADDOMAIN (*error_r from
 * mboxname_domain_check()) when the domain breaks the domain rules under
 * virtdomains userid or on. */
#define RCPT_NAMES_BADDOMAIN (-2)
int rcpt_mailbox_names(const struct imapconf *conf,
                       const struct userid_policy *policy, const char *local,
                       size_t locallen, const char *domain, size_t domainlen,
                       struct buf *inbox_r, struct buf *folder_r,
                       const char **error_r);

/* The outcome of resolving a recipient. */
enum rcpt_result {
    RCPT_OK = 0,          /* *mailbox_r names the mailbox */
    RCPT_UNKNOWN,         /* 550 5.1.1: no such user / mailbox, or a
                             local part that names none */
    RCPT_BADDOMAIN,       /* 550 5.1.2: a domain that breaks the domain
                             rules (virtdomains userid / on) */
    RCPT_NOPOST,          /* 550 5.7.1: a shared mailbox that exists but
                             does not let anyone post */
    RCPT_OVERQUOTA,       /* over quota (452 4.2.2, or 552 5.2.2) */
    RCPT_TEMPFAIL         /* database trouble: 451 4.3.0 */
};

struct rcpt_ctx;

/* Per process (after fork): reads the virtdomains policy and opens the
 * mailbox list.  conf must outlive the context.  STORE_OK, STORE_BADNAME
 * (defaultdomain is not a valid domain; logged), or mboxlist_open()'s
 * error. */
int rcpt_ctx_new(const struct imapconf *conf, struct rcpt_ctx **ctx_r);
void rcpt_ctx_free(struct rcpt_ctx **ctxp);

/* Resolve the local part of a recipient to a mailbox: the mapping above,
 * existence in the mailbox list, the p right for folders and shared
 * mailboxes, then the quota of the chosen mailbox for a message of
 * `size` bytes (the MAIL SIZE= value; 0 when none was given, then one
 * byte and one message are checked, so that a full mailbox refuses).
 * On RCPT_OK *mailbox_r holds the internal name; otherwise it is empty,
 * and *error_r (may be NULL) may say why the address names no mailbox. */
enum rcpt_result rcpt_resolve(struct rcpt_ctx *ctx, const char *local,
                              size_t locallen, const char *domain,
                              size_t domainlen, uint64_t size,
                              struct buf *mailbox_r, const char **error_r);

#endif
