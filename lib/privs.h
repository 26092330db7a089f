/*
 * privs.h - becoming the server's user.
 *
 * The master, and every admin tool that writes the configuration
 * directory or the spool, must not leave files there that the server
 * cannot write: started as root they switch to the user the server runs
 * as (`cyrus_user` in imapd.conf, default "cyrus") before they touch
 * anything.  One switch for all of them: initgroups(), setgid(),
 * setuid(), in that order, each checked; afterwards the process cannot
 * get root back.
 *
 * Tools that are given a database file rather than a configuration
 * (cyr_dbtool FILE, cvt_cyrusdb OLD NEW, ctl_cyrusdb -d DIR) have no
 * cyrus_user to go by: started as root they act as the owner of the
 * directory that holds the file (privs_drop_to_owner()), which is the
 * server's user for files of a server, and root for files of root.
 *
 * Library code: nothing here prints or exits; a failure returns a code
 * and a message (static storage, valid until the next call) meant for
 * the admin, saying what to do.
 */
#ifndef LIB_PRIVS_H
#define LIB_PRIVS_H

#include "lib/imapconf.h"

enum {
    PRIVS_OK = 0,          /* switched, or nothing to do */
    PRIVS_NOUSER = -1,     /* the user does not exist */
    PRIVS_FAILED = -2      /* a system call failed (errno in the message) */
};

/*
 * Run as `user` from now on when the process runs as root (real or
 * effective uid 0): initgroups(user), setgid(its group), setuid(its uid).
 * Nothing is done when the process is not root, or when user is root
 * (uid 0).  NULL or "" means "cyrus".  Returns PRIVS_OK, PRIVS_NOUSER or
 * PRIVS_FAILED with *error_r set (error_r may be NULL).
 */
int privs_drop_to(const char *user, const char **error_r);

/* privs_drop_to() with the configuration's cyrus_user; the messages name
 * the key and how to fix it ("create the user, or set cyrus_user in
 * imapd.conf"). */
int privs_drop_to_cyrus_user(const struct imapconf *conf,
                             const char **error_r);

/*
 * When root: become the owner of `path`'s nearest existing directory
 * (path itself when it is a directory, else its parent, walking up while
 * that does not exist yet), unless that owner is root.  The owner's
 * groups come from its passwd entry when it has one; otherwise only the
 * directory's group is kept.  Not root: nothing.  PRIVS_OK or
 * PRIVS_FAILED (with *error_r).
 */
int privs_drop_to_owner(const char *path, const char **error_r);

/*
 * May `user` create files in directory `dir` (write and search on dir,
 * search on every directory above it), judged from the mode bits, the
 * owners and the user's groups (ACLs and read-only mounts are not looked
 * at)?  Returns 1 yes, 0 no (the reason in *why_r), -1 when the user does
 * not exist or dir cannot be examined (reason in *why_r).
 */
int privs_user_can_write(const char *user, const char *dir,
                         const char **why_r);

#endif
