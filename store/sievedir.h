/*
 * sievedir.h - where users' Sieve scripts live (the layout lmtpd reads and
 * the ManageSieve server writes; Cyrus's).
 *
 *   SIEVEDIR/H/USER/                     a domain-less user
 *   SIEVEDIR/domain/DH/DOMAIN/H/USER/    user@DOMAIN
 *
 * SIEVEDIR is imapd.conf `sievedir` (empty: CONFIGDIR/sieve).  H is the
 * first byte of USER lower-cased, 'q' when it is not an ASCII letter (as
 * Cyrus's dir_hash_c); DH the same of DOMAIN.  USER is the local part of
 * the user id as users write it ('.' not '^').  In a user's directory a
 * script NAME is the text file NAME.script, and the active script is the
 * symbolic link "defaultbc" whose target is "NAME.script".
 */
#ifndef STORE_SIEVEDIR_H
#define STORE_SIEVEDIR_H

#include "lib/buf.h"
#include "lib/imapconf.h"

#define SIEVEDIR_ACTIVE "defaultbc"
#define SIEVEDIR_SUFFIX ".script"

/* SIEVEDIR itself into out (replacing its contents).  0, or -1 when out
 * of memory. */
int sievedir_root(const struct imapconf *conf, struct buf *out);

/* The directory of `userid` ("user" or "user@domain"; '^' is written as
 * '.'), without a trailing '/', into out.  0; -1 for an empty user or
 * domain, a user or domain holding '/' or a NUL, one that is "." or
 * "..", or out of memory (out emptied). */
int sievedir_user_path(const struct imapconf *conf, const char *userid,
                       struct buf *out);

/* The path of the active-script link of `userid`
 * (.../USER/defaultbc) into out; 0 or -1 as sievedir_user_path(). */
int sievedir_active_path(const struct imapconf *conf, const char *userid,
                         struct buf *out);

#endif
