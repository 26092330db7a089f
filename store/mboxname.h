/*
 * mboxname.h - mailbox names: validity, internal/external form, the
 * owner of a name, IMAP list patterns, and the spool directory of a name.
 *
 * Internal names use '.' as the hierarchy separator, as Cyrus does:
 * "user.alice" is alice's INBOX, "user.alice.Sent" a folder of hers,
 * "shared.lists" a shared mailbox.  With unixhierarchysep the external
 * (IMAP) form uses '/' instead, and a '.' inside an external component is
 * kept internally as '^' (Cyrus's convention), so "user/alice.smith" <->
 * "user.alice^smith".
 *
 * Valid internal names (mboxname_check):
 *   - 1..MBOXNAME_MAX bytes; each component 1..MBOXNAME_PART_MAX bytes;
 *   - printable US-ASCII only (0x20..0x7e): no control bytes, no 8-bit
 *     bytes (IMAP carries non-ASCII names in modified UTF-7);
 *   - no '/' anywhere (it would be a path separator in the spool), no
 *     wildcard '*' or '%';
 *   - no empty component: no leading or trailing '.', no "..";
 *   - no component "." or ".." after external conversion, i.e. no
 *     component made only of '^' characters either (they map to dots);
 *   - a name under "user." has a non-empty user part.
 *
 * Virtual domains (as Cyrus): a name may start with "DOMAIN!", as in
 * "example.com!user.alice.Sent" or "example.com!shared.news".  '!' is the
 * domain separator and appears at most once; DOMAIN obeys
 * mboxname_domain_check() and is lower-case; the rest obeys the rules
 * above; the whole name is at most MBOXNAME_MAX bytes.  '!' anywhere else
 * is refused ("'!' in name").  A name without '!' is in the default,
 * domain-less namespace, exactly as before virtual domains.
 * Pure functions: no I/O, no configuration, safe in any process.
 */
#ifndef STORE_MBOXNAME_H
#define STORE_MBOXNAME_H

#include <stddef.h>

#include "lib/buf.h"

#define MBOXNAME_MAX 490        /* bytes of a whole internal name */
#define MBOXNAME_PART_MAX 200   /* bytes of one component */
#define MBOXNAME_USER_PREFIX "user."
#define MBOXNAME_DOMAIN_MAX 253       /* bytes of a domain name */
#define MBOXNAME_DOMAIN_LABEL_MAX 63  /* bytes of one label of it */

/* STORE_OK, or STORE_BADNAME with *error_r (static text, may be NULL)
 * saying which rule failed: "empty name", "name too long", "leading
 * separator", "trailing separator", "empty component", "empty user"
 * ("user." and "user..x"), "component too long", "component of only '^'",
 * "control byte", "8-bit byte", "'/' in name", "wildcard in name",
 * "'!' in name", "upper-case domain" and the texts of
 * mboxname_domain_check() for a bad "DOMAIN!" prefix.
 * Reads at most MBOXNAME_MAX + 1 bytes of name.  "user" alone is valid
 * (a mailbox like any other; it has no owner). */
int mboxname_check(const char *name, const char **error_r);

/* Internal -> external.  unixsep: 0 keeps '.', 1 gives '/' and turns '^'
 * into '.'.  A name of a domain is written as a global admin sees it
 * (mboxname_to_external_for with no user domain): "user/alice/Sent@D".
 * The result replaces out's contents.  STORE_OK, STORE_BADNAME (name
 * fails mboxname_check), STORE_NOMEM. */
int mboxname_to_external(const char *name, int unixsep, struct buf *out);

/* External -> internal (the reverse; with unixsep a '.' in a component
 * becomes '^' and '/' the separator; without, '/' is refused).  With
 * unixsep a '^' in the external name is refused ("'^' in name"): it is the
 * internal spelling of '.', and accepting it would give two external names
 * ("a.b", "a^b") one internal name.  The result is checked with
 * mboxname_check.  '!' is refused ("'!' in name"): the result is always
 * domain-less ('@' is an ordinary byte here; mboxname_to_internal_for
 * reads "@D").  On error out is emptied.  STORE_OK, STORE_BADNAME (with
 * *error_r), STORE_NOMEM. */
int mboxname_to_internal(const char *ext, int unixsep, struct buf *out,
                         const char **error_r);

/* The owner of a name: for "user.alice" and "user.alice.X.Y", "alice"
 * (into userid, which may be NULL; returns 1); for "D!user.alice.X",
 * "alice@D"; 0 for names outside "user." and for "user." with an empty
 * user part (userid emptied).  The user id is in internal form ('^' for
 * '.'). */
int mboxname_userid(const char *name, struct buf *userid);

/* "user." + userid into out: the INBOX of userid; for "alice@D",
 * "D!user.alice" (the part after the first '@' must be a valid, lower-case
 * domain).  userid must already be in internal form ('.' written as '^'):
 * a local part holding '.' is refused, since the result would name a
 * folder of another user.
 * STORE_OK, STORE_BADNAME (userid empty, holds '.', or the result is not a
 * valid name; out emptied), STORE_NOMEM. */
int mboxname_user_inbox(const char *userid, struct buf *out);

/* 1 when `name` is `parent` or lies below it ("user.a.b" is below
 * "user.a"; "user.ab" is not). */
int mboxname_is_self_or_child(const char *parent, const char *name);

/* IMAP LIST pattern match (RFC 3501 6.3.8) on names in the same form:
 * '*' matches any bytes, '%' any bytes except `sep`.  Returns 1 on a match.
 * Comparison is byte-exact except that the leading "INBOX" of a pattern is
 * the caller's business (imapd maps it before calling).  Time is
 * O(|pattern| * |name|) for any pattern (no exponential backtracking);
 * names longer than 512 bytes need a heap row, and when that allocation
 * fails the answer is 0 (no match). */
int mboxname_match(const char *pattern, const char *name, char sep);

/* The directory of a mailbox under a partition root:
 *   hashed = 0: ROOT/user/alice/Sent          (each '.' -> '/')
 *   hashed = 1: ROOT/H/user/alice/Sent        H = mboxname_hash_letter()
 * and for a name of a domain, "example.com!user.alice.Sent" (as Cyrus):
 *   hashed = 0: ROOT/domain/example.com/user/alice/Sent
 *   hashed = 1: ROOT/domain/E/example.com/H/user/alice/Sent
 *               E = mboxname_domain_hash_letter("example.com") = 'e',
 *               H = mboxname_hash_letter() of the rest, "user.alice" = 'a'
 * so no directory holds mailboxes of two domains.
 * '^' stays '^' in the path, as in Cyrus.  A trailing '/' of ROOT is not
 * doubled.  Result replaces out's contents (emptied on error).  STORE_OK,
 * STORE_BADNAME (invalid name or empty root), STORE_NOMEM. */
int mboxname_spool_dir(const char *root, const char *name, int hashed,
                       struct buf *out);

/* The hash directory of a name, as Cyrus's hashimapspool: the first letter
 * of the user id for "user.*" names, else of the name, lower-cased; 'q'
 * when that byte is not an ASCII letter.  Note that "user" itself hashes
 * to 'u' while "user.bob" hashes to 'b': a mailbox's children need not
 * share its hash directory (mboxlist_rename() handles that).  For a
 * name of a domain, the letter of the part after "DOMAIN!". */
char mboxname_hash_letter(const char *name);

/* The hash directory of a domain: its first byte lower-cased, 'q' when
 * that is not an ASCII letter (or domain is NULL or empty). */
char mboxname_domain_hash_letter(const char *domain);

/* ---- virtual domains ---- */

/* The domain rules, on (d, len) (no NUL needed; bytes past len never
 * read): 1..MBOXNAME_DOMAIN_MAX bytes; labels separated by single '.',
 * each 1..MBOXNAME_DOMAIN_LABEL_MAX bytes of [A-Za-z0-9-], none beginning
 * or ending with '-'; no leading or trailing '.'; at least two labels; not
 * an address literal "[...]".  On success the lower-cased domain replaces
 * lower_r's contents (lower_r may be NULL).  STORE_OK, STORE_BADNAME with
 * *error_r: "empty domain", "domain too long", "address literal as
 * domain", "empty domain label", "domain label too long", "domain label
 * begins or ends with '-'", "bad byte in domain", "domain of one label";
 * STORE_NOMEM. */
int mboxname_domain_check(const char *d, size_t len, struct buf *lower_r,
                          const char **error_r);

/* The domain of an internal name: a pointer to it (into name, not
 * NUL-terminated: its length in *len_r) and *rest_r -> the part after
 * '!'.  For a domain-less name: NULL, *len_r = 0, *rest_r = name.  Looks
 * for '!' only, does not validate (use mboxname_check); len_r and rest_r
 * may be NULL. */
const char *mboxname_domain(const char *name, size_t *len_r,
                            const char **rest_r);

/* The external name of an internal one as a session sees it.  userdomain:
 * the domain of the logged-in user (NULL or "" for a domain-less user);
 * global_admin: 1 for a domain-less admin of every domain.
 *   - a name of the user's own domain (both domain-less, or both D):
 *     mboxname_to_external() of the part after "D!";
 *   - a name of another domain, for a global admin: that, with "@D"
 *     appended to the whole name as Cyrus does ("user.bob@example.com",
 *     "user/bob/Sent@example.com", "shared.news@example.com");
 *   - anything else (another domain for a non-admin, or a domain-less
 *     name seen by a user of a domain): STORE_BADNAME, i.e. invisible.
 * With virtdomains off every name and user is domain-less, and this is
 * mboxname_to_external().  Result replaces out's contents (emptied on
 * error).  STORE_OK, STORE_BADNAME, STORE_NOMEM. */
int mboxname_to_external_for(const char *name, int unixsep,
                             const char *userdomain, int global_admin,
                             struct buf *out);

/* The reverse: an external name written by a session into an internal
 * name.  Names of a user without '@' land in the user's domain
 * ("user/bob" from a user of D -> "D!user.bob"; domain-less for a
 * domain-less user).  "NAME@D" (split at the last '@'; D obeys the domain
 * rules and is lower-cased) is accepted from a global admin only and
 * gives "D!NAME"; from others STORE_BADNAME "'@' in name".  '!' is always
 * refused ("'!' in name").  The default domain is not known here: a
 * caller that has one strips "@DEFAULTDOMAIN" first (userid_canon does
 * that for user ids).  With virtdomains off, use mboxname_to_internal()
 * ('@' stays an ordinary byte there).  Result replaces out's contents
 * (emptied on error).  STORE_OK, STORE_BADNAME (with *error_r),
 * STORE_NOMEM. */
int mboxname_to_internal_for(const char *ext, int unixsep,
                             const char *userdomain, int global_admin,
                             struct buf *out, const char **error_r);

#endif
