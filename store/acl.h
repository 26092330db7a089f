/*
 * acl.h - access control lists with Cyrus's rights letters (RFC 4314).
 *
 * Rights: l lookup, r read, s keep seen, w write flags, i insert (append),
 * p post (LMTP delivery to a non-INBOX folder), k create mailboxes,
 * x delete mailbox, t delete messages, e expunge, a administer; plus the
 * obsolete c (= k + x) and d (= t + e) accepted on input (RFC 4314 2.1.1).
 *
 * An ACL string is Cyrus's: "ID<TAB>RIGHTS<TAB>" repeated, e.g.
 * "alice\tlrswipkxtea\tanyone\tp\t".  Identifiers: user ids, "anyone",
 * "anonymous"; a leading '-' marks negative rights (RFC 4314 2.2).
 * Pure functions, no I/O.
 */
#ifndef STORE_ACL_H
#define STORE_ACL_H

#include <stddef.h>

#include "lib/buf.h"

enum acl_right {
    ACL_LOOKUP = 1 << 0,    /* l */
    ACL_READ = 1 << 1,      /* r */
    ACL_SEEN = 1 << 2,      /* s */
    ACL_WRITE = 1 << 3,     /* w */
    ACL_INSERT = 1 << 4,    /* i */
    ACL_POST = 1 << 5,      /* p */
    ACL_CREATE = 1 << 6,    /* k */
    ACL_DELETEMBOX = 1 << 7,/* x */
    ACL_DELETEMSG = 1 << 8, /* t */
    ACL_EXPUNGE = 1 << 9,   /* e */
    ACL_ADMIN = 1 << 10     /* a */
};
#define ACL_ALL 0x7ff
/* What a new user's INBOX grants its owner (Cyrus's default). */
#define ACL_OWNER_DEFAULT "lrswipkxtea"

/* Rights letters -> bit mask in *mask_r.  'c' and 'd' expand as above.
 * Letters are case-sensitive; "" gives 0.  Returns 0, or -1 on an unknown
 * letter or NULL (*mask_r untouched). */
int acl_parse_rights(const char *letters, int *mask_r);

/* Bit mask -> letters in canonical order "lrswipkxtea" (NUL-terminated,
 * out must hold 12 bytes).  Returns out. */
char *acl_rights_string(int mask, char out[12]);

/* The rights `userid` has under `acl`: the union of its own entry and
 * "anyone" ("anonymous" only for userid "anonymous"), minus the negative
 * entries for the same identifiers (in any order; identifiers compare
 * byte-exactly; several entries of one identifier are united).  userid
 * NULL counts as nobody in particular: "anyone" only.  userid in `admins`
 * (a list separated by spaces, tabs or commas, may be NULL) additionally
 * gets ACL_LOOKUP|ACL_ADMIN|ACL_CREATE|ACL_DELETEMBOX, as Cyrus's admins
 * do, after the negative rights (an admin cannot be locked out).  A
 * malformed ACL string gives 0 rights, except those of admins (and is
 * logged once by the caller's check; see acl_check). */
int acl_rights(const char *acl, const char *userid, const char *admins);

/* Set (mask != 0) or remove (mask == 0) the entry of `identifier` in an ACL
 * string, writing the new ACL into out (acl may be NULL = empty).  Entries
 * keep their order; a new one goes at the end; a negative entry ("-bob")
 * is an identifier of its own.  Every entry is written with its rights in
 * canonical order, and later duplicates of `identifier` are dropped.
 * 0, or -1 (out emptied) when acl is malformed, identifier is empty, "-",
 * or holds a TAB/control byte, or mask has bits outside ACL_ALL. */
int acl_set(const char *acl, const char *identifier, int mask,
            struct buf *out);

/* Call fn(rock, id, idlen, mask) for every entry of acl in order (id
 * points into acl, not NUL-terminated; a negative entry's id keeps its
 * '-'; mask is the entry's rights, c and d expanded).  fn returning
 * non-zero stops the walk with that value.  0, -1 when acl is malformed
 * (entries before the bad one have been passed). */
typedef int acl_each_fn(void *rock, const char *id, size_t idlen, int mask);
int acl_each(const char *acl, acl_each_fn *fn, void *rock);

/* The rights of the entries of exactly `identifier` (byte-exact, "-bob"
 * is its own identifier; several entries are united): a mask, 0 when it
 * has none, -1 when acl is malformed. */
int acl_entry_rights(const char *acl, const char *identifier);

/* 0 when acl is well formed (pairs of non-empty id and known letters, each
 * followed by TAB), -1 otherwise.  NULL and "" are well formed (empty);
 * an empty rights field is allowed; ids may not hold control bytes
 * (0x00-0x1f, 0x7f) nor be "-" alone; c and d are accepted. */
int acl_check(const char *acl);

#endif
