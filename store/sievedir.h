/*
 * sievedir.h - where a user's Sieve scripts live on disk, and the
 * operations ManageSieve (timsieved) and the admin tool (mbtool sieve)
 * do on them.  Delivery reads the same layout.
 *
 * Layout (as Cyrus's timsieved; SIEVEDIR is imapd.conf's `sievedir`,
 * default CONFIGDIR/sieve):
 *
 *   SIEVEDIR/H/USER/                  a domain-less user "USER"
 *   SIEVEDIR/domain/DH/DOMAIN/H/USER/ the user "USER@DOMAIN"
 *
 * H is the first byte of USER, DH the first byte of DOMAIN, each
 * lower-cased when it is a letter, else 'q' (Cyrus's dir_hash_c).  USER
 * is the local part of the internal user id (store/userid.h) as spelled
 * there ('.' stays '.').
 *
 * In a user's directory:
 *   NAME.script   one script, its text exactly as uploaded
 *   NAME.bc       its compiled form (sieve/sieve_bc.h), written by
 *                 timsieved, mbtool sieve and sievec when the script is
 *                 stored, and by lmtpd when it finds it missing or stale;
 *                 a cache: it carries the source's size and hashes, and
 *                 a reader that finds it stale or damaged compiles the
 *                 text.  Deleted and renamed with its script.
 *   defaultbc     the active script: a symbolic link whose target is
 *                 "NAME.script" (relative); absent when none is active
 *   .*            temporary files of a write in progress (never listed;
 *                 a script name cannot start with '.')
 *
 * Crash safety.  A script is written to a temporary file in the same
 * directory, fsynced, renamed over NAME.script, and the directory
 * fsynced: a reader sees the old text or the new, never a part.  The
 * active link is replaced the same way (new link under a temporary
 * name, rename over defaultbc).  A rename of the active script links
 * the new name first, points defaultbc at it, then removes the old
 * name: at every point defaultbc names an existing file.
 *
 * Script names (RFC 5804 section 1.6, narrowed for file names): 1 to
 * SIEVEDIR_NAME_MAX bytes of UTF-8 without control characters (below
 * 0x20, 0x7f), '/', and not starting with '.'.
 *
 * Return codes: SIEVEDIR_OK (0) or one of the negative SIEVEDIR_* below;
 * the I/O errors leave errno set.  Library code: nothing is logged.
 * Several processes may work on one user's directory at once; each
 * operation is atomic on its own, a sequence of them is not (two
 * clients renaming at once may each see the other's result).
 */
#ifndef STORE_SIEVEDIR_H
#define STORE_SIEVEDIR_H

#include <stddef.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "lib/strarray.h"

#define SIEVEDIR_OK         0
#define SIEVEDIR_NOTFOUND  -1   /* no such script (or user directory) */
#define SIEVEDIR_EXISTS    -2   /* the new name of a rename is taken */
#define SIEVEDIR_ACTIVE    -3   /* delete of the active script */
#define SIEVEDIR_BADNAME   -4   /* invalid script name or user id */
#define SIEVEDIR_IOERROR   -5   /* file system error (errno) */
#define SIEVEDIR_NOMEM     -6

#define SIEVEDIR_NAME_MAX 512          /* bytes of a script name */
#define SIEVEDIR_ACTIVE_LINK "defaultbc"
#define SIEVEDIR_SUFFIX ".script"
#define SIEVEDIR_BC_SUFFIX ".bc"

/* A short constant text for a code. */
const char *sievedir_strerror(int code);

/* SIEVEDIR: `sievedir`, or CONFIGDIR/sieve when it is empty.  Replaces
 * out's contents.  SIEVEDIR_OK or SIEVEDIR_NOMEM. */
int sievedir_root(const struct imapconf *conf, struct buf *out);

/* The directory of internal user id `userid` ("alice",
 * "alice@example.com"), without a trailing '/', per the layout above.
 * Replaces out's contents.  SIEVEDIR_OK, SIEVEDIR_BADNAME (empty local
 * part or domain, '/', a part "." or ".."), SIEVEDIR_NOMEM. */
int sievedir_user_path(const struct imapconf *conf, const char *userid,
                       struct buf *out);

/* The active script's link of userid: sievedir_user_path() followed by
 * "/defaultbc".  Its codes. */
int sievedir_active_path(const struct imapconf *conf, const char *userid,
                         struct buf *out);

/* The directory of the global scripts (RFC 6609 include :global), as
 * Cyrus keeps them: `sieve_globaldir`, or SIEVEDIR/global when it is
 * empty; NAME.script files there, like a user's.  Replaces out's
 * contents.  SIEVEDIR_OK or SIEVEDIR_NOMEM. */
int sievedir_global_path(const struct imapconf *conf, struct buf *out);

/* 1 when name[0..len) is a valid script name, else 0. */
int sievedir_name_valid(const char *name, size_t len);

/* DIR/NAME.script into out.  SIEVEDIR_OK, SIEVEDIR_BADNAME,
 * SIEVEDIR_NOMEM. */
int sievedir_script_path(const char *dir, const char *name,
                         struct buf *out);

/* The names of the scripts in dir (without ".script"), sorted, appended
 * to names; the active one's name into active (emptied when none is
 * active or the link points at no listed script).  A missing directory
 * is an empty list.  active may be NULL.  SIEVEDIR_OK, SIEVEDIR_IOERROR,
 * SIEVEDIR_NOMEM. */
int sievedir_list(const char *dir, struct strarray *names,
                  struct buf *active);

/* The active script's name into name.  1 when there is one, 0 when not
 * (no link, or a dangling one), or SIEVEDIR_IOERROR / SIEVEDIR_NOMEM. */
int sievedir_active(const char *dir, struct buf *name);

/* Script `name`'s text into out (replaced).  SIEVEDIR_OK,
 * SIEVEDIR_NOTFOUND, SIEVEDIR_BADNAME, SIEVEDIR_IOERROR, SIEVEDIR_NOMEM.
 * Files larger than max bytes (0: no limit) give SIEVEDIR_IOERROR with
 * errno EFBIG. */
int sievedir_get(const char *dir, const char *name, size_t max,
                 struct buf *out);

/* The same, with the file's fstat() in *st_r. */
struct stat;
int sievedir_get_st(const char *dir, const char *name, size_t max,
                    struct buf *out, struct stat *st_r);

/* Store text as script `name` (created or replaced; the directory and
 * its parents are created, mode 0750).  Durable on SIEVEDIR_OK.
 * SIEVEDIR_OK, SIEVEDIR_BADNAME, SIEVEDIR_IOERROR, SIEVEDIR_NOMEM. */
int sievedir_put(const char *dir, const char *name, const char *text,
                 size_t len);

/* DIR/NAME.bc (the compiled form of script `name`) into out.
 * SIEVEDIR_OK, SIEVEDIR_BADNAME, SIEVEDIR_NOMEM. */
int sievedir_bc_path(const char *dir, const char *name, struct buf *out);

/* The compiled form of script `name` into out (replaced), as
 * sievedir_get() does for the text; its codes. */
int sievedir_get_bc(const char *dir, const char *name, size_t max,
                    struct buf *out);

/* Store data as the compiled form of script `name` (temporary file,
 * rename; sync = 1: fsync the file and the directory as sievedir_put()
 * does, 0: not (a reader that recompiles writes a cache it can lose)).
 * SIEVEDIR_OK, SIEVEDIR_BADNAME, SIEVEDIR_IOERROR, SIEVEDIR_NOMEM. */
int sievedir_put_bc(const char *dir, const char *name, const char *data,
                    size_t len, int sync);

/* Encode script (compiled from text[0..len) against the extension list
 * allowed, NULL: all) and store it with sievedir_put_bc(), naming its
 * source (sieve_bc_set_source()): src, the stat of the file the text
 * was read from, or with src NULL NAME.script when it holds text now
 * (else no source: loaders then read the text).  Its codes;
 * SIEVEDIR_BADNAME also when script is NULL. */
struct sieve_script;
int sievedir_store_bc(const char *dir, const char *name,
                      const struct sieve_script *script, const char *text,
                      size_t len, const struct strarray *allowed,
                      const struct stat *src, int sync);

/* A script file's mtime in nanoseconds since the epoch. */
int64_t sievedir_mtime_ns(const struct stat *st);

/* Name the file whose stat is st as the source of the stored form
 * bc[0..len) (sieve_bc_set_source()).  0, or -1 when bc is not one. */
int sievedir_bc_set_source(void *bc, size_t len, const struct stat *st);

/* 1 when the stored form bc[0..len) names as its source the file whose
 * stat is st (the same inode, mtime and size): it is then current for
 * that file's text without reading it; else 0. */
int sievedir_bc_is_source(const void *bc, size_t len, const struct stat *st);

/* Make sure script `name` has a current compiled form: keep NAME.bc
 * when it loads for the text under limits and allowed (NULL: defaults,
 * all), else compile the text and store it.  *stored_r (may be NULL):
 * 1 when NAME.bc was written, 0 when it was current; err (may be NULL):
 * the compiler's line and reason when the text does not compile.
 * SIEVEDIR_OK, SIEVEDIR_NOTFOUND, SIEVEDIR_BADNAME (the text does not
 * compile), SIEVEDIR_IOERROR, SIEVEDIR_NOMEM. */
struct sieve_limits;
int sievedir_ensure_bc(const char *dir, const char *name,
                       const struct sieve_limits *limits,
                       const struct strarray *allowed, int sync,
                       int *stored_r, struct buf *err);

/* fn(rock, dir) for every user directory under the configuration's
 * sieve root, in sorted order: SIEVEDIR/H/USER and, with domains,
 * SIEVEDIR/domain/DH/DOMAIN/H/USER.  A nonzero return of fn stops the
 * walk and is returned.  SIEVEDIR_OK (also when there is no root yet),
 * SIEVEDIR_IOERROR (errno) when a directory of the layout cannot be
 * read, SIEVEDIR_NOMEM. */
typedef int sievedir_user_fn(void *rock, const char *dir);
int sievedir_foreach_user(const struct imapconf *conf, sievedir_user_fn *fn,
                          void *rock);

/* Make `name` the active script; name NULL or "" deactivates (no error
 * when none was active).  SIEVEDIR_OK, SIEVEDIR_NOTFOUND,
 * SIEVEDIR_BADNAME, SIEVEDIR_IOERROR, SIEVEDIR_NOMEM. */
int sievedir_activate(const char *dir, const char *name);

/* Remove script `name`.  SIEVEDIR_OK, SIEVEDIR_NOTFOUND, SIEVEDIR_ACTIVE
 * (it is the active one: deactivate first), SIEVEDIR_BADNAME,
 * SIEVEDIR_IOERROR, SIEVEDIR_NOMEM. */
int sievedir_delete(const char *dir, const char *name);

/* Rename script oldname to newname, keeping it active when it was.
 * SIEVEDIR_OK, SIEVEDIR_NOTFOUND, SIEVEDIR_EXISTS, SIEVEDIR_BADNAME,
 * SIEVEDIR_IOERROR, SIEVEDIR_NOMEM.  Renaming a script to its own name
 * is SIEVEDIR_EXISTS. */
int sievedir_rename(const char *dir, const char *oldname,
                    const char *newname);

/* The number of scripts in dir (0 for a missing directory), or
 * SIEVEDIR_IOERROR. */
long sievedir_count(const char *dir);

#endif
