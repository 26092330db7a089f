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
 * Pure functions: no I/O, no configuration, safe in any process.
 */
#ifndef STORE_MBOXNAME_H
#define STORE_MBOXNAME_H

#include <stddef.h>

#include "lib/buf.h"

#define MBOXNAME_MAX 490        /* bytes of a whole internal name */
#define MBOXNAME_PART_MAX 200   /* bytes of one component */
#define MBOXNAME_USER_PREFIX "user."

/* STORE_OK, or STORE_BADNAME with *error_r (static text, may be NULL)
 * saying which rule failed: "empty name", "name too long", "leading
 * separator", "trailing separator", "empty component", "empty user"
 * ("user." and "user..x"), "component too long", "component of only '^'",
 * "control byte", "8-bit byte", "'/' in name", "wildcard in name".
 * Reads at most MBOXNAME_MAX + 1 bytes of name.  "user" alone is valid
 * (a mailbox like any other; it has no owner). */
int mboxname_check(const char *name, const char **error_r);

/* Internal -> external.  unixsep: 0 keeps '.', 1 gives '/' and turns '^'
 * into '.'.  The result replaces out's contents.  STORE_OK, STORE_BADNAME
 * (name fails mboxname_check), STORE_NOMEM. */
int mboxname_to_external(const char *name, int unixsep, struct buf *out);

/* External -> internal (the reverse; with unixsep a '.' in a component
 * becomes '^' and '/' the separator; without, '/' is refused).  With
 * unixsep a '^' in the external name is refused ("'^' in name"): it is the
 * internal spelling of '.', and accepting it would give two external names
 * ("a.b", "a^b") one internal name.  The result is checked with
 * mboxname_check.  On error out is emptied.  STORE_OK, STORE_BADNAME (with
 * *error_r), STORE_NOMEM. */
int mboxname_to_internal(const char *ext, int unixsep, struct buf *out,
                         const char **error_r);

/* The owner of a name: for "user.alice" and "user.alice.X.Y", "alice"
 * (into userid, which may be NULL; returns 1); 0 for names outside "user."
 * and for "user." with an empty user part (userid emptied).  The user id
 * is in internal form ('^' for '.'). */
int mboxname_userid(const char *name, struct buf *userid);

/* "user." + userid into out: the INBOX of userid.  userid must already
 * be in internal form ('.' written as '^'): a userid holding '.' is
 * refused, since the result would name a folder of another user.
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
 * '^' stays '^' in the path, as in Cyrus.  A trailing '/' of ROOT is not
 * doubled.  Result replaces out's contents (emptied on error).  STORE_OK,
 * STORE_BADNAME (invalid name or empty root), STORE_NOMEM. */
int mboxname_spool_dir(const char *root, const char *name, int hashed,
                       struct buf *out);

/* The hash directory of a name, as Cyrus's hashimapspool: the first letter
 * of the user id for "user.*" names, else of the name, lower-cased; 'q'
 * when that byte is not an ASCII letter.  Note that "user" itself hashes
 * to 'u' while "user.bob" hashes to 'b': a mailbox's children need not
 * share its hash directory (mboxlist_rename() handles that). */
char mboxname_hash_letter(const char *name);

#endif
