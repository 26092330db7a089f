/*
 * userid.h - user ids and virtual domains: turning a login name or an LMTP
 * recipient into the internal user id, as Cyrus's virtdomains does.
 *
 * A user id (internal form) is "alice" (the default, domain-less
 * namespace) or "alice@example.com".  The domain part is lower-case and
 * obeys mboxname_domain_check(); it is never the defaultdomain (that one
 * is stripped: "alice@DEFAULTDOMAIN" -> "alice").  With virtdomains off
 * every user id is domain-less.
 *
 * The local part keeps the user's own spelling: a '.' stays '.' here and
 * becomes '^' in mailbox names (userid_inbox).  It is 1..MBOXNAME_PART_MAX
 * bytes of printable US-ASCII without '@', '!', '/', '^', '*', '%'
 * (control bytes, 8-bit bytes and spaces are refused as well).
 *
 * The configuration keys (imapd.conf):
 *   virtdomains: off | userid | on    (refused at load when anything else)
 *   defaultdomain: DOMAIN             (empty: none)
 */
#ifndef STORE_USERID_H
#define STORE_USERID_H

#include "lib/buf.h"
#include "lib/imapconf.h"

enum userid_virtdomains {
    USERID_VIRTDOMAINS_OFF = 0,
    USERID_VIRTDOMAINS_USERID = 1,
    USERID_VIRTDOMAINS_ON = 2
};

struct userid_policy {
    int virtdomains;        /* enum userid_virtdomains */
    char *defaultdomain;    /* lower-case, "" = none; owned */
};

/* From the configuration: virtdomains and defaultdomain (validated with
 * the domain rules and lower-cased).  STORE_OK, or STORE_BADNAME with
 * *error_r (static text) when defaultdomain is not a valid domain, or
 * STORE_NOMEM.  On error *p holds nothing to free. */
int userid_policy_init(const struct imapconf *conf, struct userid_policy *p,
                       const char **error_r);
void userid_policy_free(struct userid_policy *p);

/* The internal user id of a raw login or recipient ("alice",
 * "alice@Example.COM"; the caller lower-cases the local part first when it
 * wants to).  raw is split at its '@' (at most one).  serverdomain: the
 * domain of the local address the client connected to (used with
 * virtdomains on; NULL when unknown; one that fails the domain rules,
 * such as a one-label host name, counts as unknown).
 *   off:    a domain is validated, then dropped: "alice@D" -> "alice"
 *   userid: "alice@D" -> "alice@D", or "alice" when D is the
 *           defaultdomain; "alice" -> "alice"
 *   on:     as userid; "alice" -> "alice@S" with S = serverdomain, or
 *           "alice" when S is NULL or the defaultdomain
 * Result replaces out's contents (emptied on error).  STORE_OK,
 * STORE_BADNAME with *error_r ("empty user id", "empty local part",
 * "'@' in local part", "'!' in user id", "'/' in user id", "'^' in user
 * id", "wildcard in user id", "control byte or space in user id", "8-bit
 * byte in user id", "user id too long", or a domain rule of
 * mboxname_domain_check()), STORE_NOMEM. */
int userid_canon(const struct userid_policy *p, const char *raw,
                 const char *serverdomain, struct buf *out,
                 const char **error_r);

/* The canonicalisation step of a login (SASL's canon callback, for imapd
 * and timsieved alike): the login name (in, len) becomes the internal
 * user id in out.  serverdomain (may be NULL) is asked for the server's
 * domain only when virtdomains is "on" and the name has no '@'.  A name
 * that is no valid user id (userid_canon's reasons, or a NUL byte) sets
 * *canon_error and is passed on unchanged (NULs as '?'), so that the
 * caller refuses the login whatever the password check says.  0, or -1
 * with *error_r set (out of memory): SASL's convention. */
int userid_canon_login(const struct userid_policy *p, const char *in,
                       size_t len, const char *(*serverdomain)(void *rock),
                       void *rock, struct buf *out, const char **canon_error,
                       const char **error_r);

/* The domain of an internal user id: the part after its '@', or NULL for
 * a domain-less one. */
const char *userid_domain(const char *userid);

/* The INBOX of an internal user id: "alice" -> "user.alice",
 * "alice@D" -> "D!user.alice", "alice.smith" -> "user.alice^smith".
 * Result replaces out's contents (emptied on error).  STORE_OK,
 * STORE_BADNAME (not a valid user id), STORE_NOMEM. */
int userid_inbox(const char *userid, struct buf *out);

#endif
