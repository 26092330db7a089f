/*
 * privs.c - becoming the server's user (see privs.h).
 *
 * Invariant: after a successful switch the real, effective and saved ids
 * are all the target's (setgid() and setuid() as root set all three), and
 * the supplementary groups are the target's own, so nothing of root is
 * left.  The order matters: groups and gid while still root, uid last.
 */
#include "config.h"

#include <errno.h>
#include <grp.h>
#include <limits.h>
#include <pwd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/privs.h"

#define PRIVS_DEFAULT_USER "cyrus"
#define PRIVS_MAX_GROUPS 256

static char privs_msg[PATH_MAX + 512];

static int privs_root(void)
{
    return getuid() == 0 || geteuid() == 0;
}

static int privs_error(const char **error_r, int r, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int privs_error(const char **error_r, int r, const char *fmt, ...)
{
    va_list ap;

    va_start(ap, fmt);
    vsnprintf(privs_msg, sizeof(privs_msg), fmt, ap);
    va_end(ap);
    if (error_r)
        *error_r = privs_msg;
    return r;
}

/* The switch itself: groups (from name when not NULL, else just gid),
 * gid, uid. */
static int privs_switch(const char *name, uid_t uid, gid_t gid,
                        const char **error_r)
{
    int r;

    if (name)
        r = initgroups(name, gid);
    else
        r = setgroups(1, &gid);
    if (r < 0 || setgid(gid) < 0 || setuid(uid) < 0)
        return privs_error(error_r, PRIVS_FAILED, "cannot switch to user %s "
                           "(uid %ld): %s", name ? name : "(no name)",
                           (long)uid, strerror(errno));
    /* a setuid() that left a way back would be a bug: check */
    if (uid != 0 && (setuid(0) == 0 || geteuid() == 0))
        return privs_error(error_r, PRIVS_FAILED, "switched to uid %ld but "
                           "root could be regained", (long)uid);
    return PRIVS_OK;
}

int privs_drop_to(const char *user, const char **error_r)
{
    struct passwd *pw;

    if (!privs_root())
        return PRIVS_OK;
    if (!user || !*user)
        user = PRIVS_DEFAULT_USER;
    errno = 0;
    pw = getpwnam(user);
    if (!pw)
        return privs_error(error_r, PRIVS_NOUSER, "user %s does not exist%s%s",
                           user, errno ? ": " : "", errno ? strerror(errno) : "");
    if (pw->pw_uid == 0)
        return PRIVS_OK;
    return privs_switch(pw->pw_name, pw->pw_uid, pw->pw_gid, error_r);
}

int privs_drop_to_cyrus_user(const struct imapconf *conf, const char **error_r)
{
    const char *user = conf ? imapconf_getstring(conf, "cyrus_user") : NULL;
    const char *err = NULL;
    int r;

    if (!user || !*user)
        user = PRIVS_DEFAULT_USER;
    r = privs_drop_to(user, &err);
    if (r == PRIVS_NOUSER) {
        char copy[sizeof(privs_msg)];
        snprintf(copy, sizeof(copy), "%s", err);
        return privs_error(error_r, r, "running as root, and cyrus_user "
                           "(the user the server runs as) is \"%s\": %s; "
                           "create that user, or name the right one with "
                           "\"cyrus_user: NAME\" in imapd.conf "
                           "(\"cyrus_user: root\" keeps root)", user, copy);
    }
    if (r != PRIVS_OK) {
        char copy[sizeof(privs_msg)];
        snprintf(copy, sizeof(copy), "%s", err);
        return privs_error(error_r, r, "running as root: cyrus_user: %s",
                           copy);
    }
    return PRIVS_OK;
}

/* The nearest existing directory of path into dir (path itself, or a
 * parent; "." for a relative name without one) with its stat in *st.
 * 0, or -1 with errno. */
static int privs_existing_dir(const char *path, struct buf *dir,
                              struct stat *st)
{
    char *slash;

    if (buf_setcstr(dir, path && *path ? path : ".") < 0)
        return -1;
    for (;;) {
        if (stat(buf_cstring(dir), st) == 0) {
            if (S_ISDIR(st->st_mode))
                return 0;
        } else if (errno != ENOENT && errno != ENOTDIR) {
            return -1;
        }
        /* one level up */
        while (dir->len > 1 && dir->s[dir->len - 1] == '/')
            buf_truncate(dir, dir->len - 1);
        slash = strrchr(buf_cstring(dir), '/');
        if (!slash) {
            if (buf_setcstr(dir, ".") < 0)
                return -1;
        } else {
            buf_truncate(dir, slash == dir->s ? 1 : (size_t)(slash - dir->s));
        }
    }
}

int privs_drop_to_owner(const char *path, const char **error_r)
{
    struct buf dir = BUF_INITIALIZER;
    struct passwd *pw;
    struct stat st;
    int r;

    if (!privs_root())
        return PRIVS_OK;
    if (privs_existing_dir(path, &dir, &st) < 0) {
        r = privs_error(error_r, PRIVS_FAILED, "%s: %s", path,
                        strerror(errno));
        buf_free(&dir);
        return r;
    }
    buf_free(&dir);
    if (st.st_uid == 0)
        return PRIVS_OK;
    pw = getpwuid(st.st_uid);
    return privs_switch(pw ? pw->pw_name : NULL, st.st_uid,
                        pw ? pw->pw_gid : st.st_gid, error_r);
}

/* Does the user (uid, groups) have the `want` bits (as for the owner:
 * S_IWUSR, S_IXUSR) on st? */
static int privs_allows(const struct stat *st, uid_t uid, const gid_t *groups,
                        int ngroups, mode_t want)
{
    int i;

    if (uid == 0)
        return 1;
    if (st->st_uid == uid)
        return (st->st_mode & want) == want;
    for (i = 0; i < ngroups; i++)
        if (groups[i] == st->st_gid)
            return (st->st_mode & (want >> 3)) == (want >> 3);
    return (st->st_mode & (want >> 6)) == (want >> 6);
}

int privs_user_can_write(const char *user, const char *dir, const char **why_r)
{
    gid_t groups[PRIVS_MAX_GROUPS];
    int ngroups = PRIVS_MAX_GROUPS;
    struct buf p = BUF_INITIALIZER;
    struct passwd *pw;
    struct stat st;
    char *slash;
    int r = 1;

    pw = getpwnam(user);
    if (!pw)
        return privs_error(why_r, -1, "user %s does not exist", user);
    if (getgrouplist(pw->pw_name, pw->pw_gid, groups, &ngroups) < 0)
        ngroups = PRIVS_MAX_GROUPS;    /* the first ones are enough */
    if (stat(dir, &st) < 0)
        return privs_error(why_r, -1, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        return privs_error(why_r, 0, "%s: not a directory", dir);
    if (!privs_allows(&st, pw->pw_uid, groups, ngroups, S_IWUSR | S_IXUSR))
        return privs_error(why_r, 0, "%s: user %s may not write there "
                           "(owner uid %ld, group gid %ld, mode %04o)", dir,
                           user, (long)st.st_uid, (long)st.st_gid,
                           (unsigned)(st.st_mode & 07777));
    /* every directory above must be searchable */
    if (buf_setcstr(&p, dir) < 0)
        return privs_error(why_r, -1, "out of memory");
    while ((slash = strrchr(buf_cstring(&p), '/')) != NULL) {
        buf_truncate(&p, slash == p.s ? 1 : (size_t)(slash - p.s));
        if (stat(buf_cstring(&p), &st) == 0 &&
            !privs_allows(&st, pw->pw_uid, groups, ngroups, S_IXUSR)) {
            r = privs_error(why_r, 0, "%s: user %s may not pass through %s "
                            "(owner uid %ld, mode %04o)", dir, user,
                            buf_cstring(&p), (long)st.st_uid,
                            (unsigned)(st.st_mode & 07777));
            break;
        }
        if (p.len == 1)
            break;
    }
    buf_free(&p);
    return r;
}
