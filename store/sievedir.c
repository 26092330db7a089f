/*
 * sievedir.c - a user's Sieve scripts on disk (layout, names and the
 * crash-safety argument: sievedir.h).
 *
 * Invariants kept by every write: NAME.script only ever appears whole
 * (temporary file + fsync + rename + directory fsync); defaultbc is only
 * ever replaced by rename(2) of a complete link and points at an
 * existing script whenever it exists, except after a crash between the
 * unlink and the directory sync of a delete, which the delete forbids
 * for the active script anyway.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lib/fsutil.h"
#include "sieve/sieve_bc.h"
#include "store/sievedir.h"

#define SIEVEDIR_SUFFIX_LEN (sizeof(SIEVEDIR_SUFFIX) - 1)

const char *sievedir_strerror(int code)
{
    switch (code) {
    case SIEVEDIR_OK: return "success";
    case SIEVEDIR_NOTFOUND: return "no such script";
    case SIEVEDIR_EXISTS: return "a script of that name exists";
    case SIEVEDIR_ACTIVE: return "the script is active";
    case SIEVEDIR_BADNAME: return "invalid name";
    case SIEVEDIR_IOERROR: return "I/O error";
    case SIEVEDIR_NOMEM: return "out of memory";
    default: return "unknown error";
    }
}

int sievedir_root(const struct imapconf *conf, struct buf *out)
{
    const char *d = imapconf_getstring(conf, "sievedir");

    buf_reset(out);
    if (d && *d)
        return buf_setcstr(out, d) < 0 ? SIEVEDIR_NOMEM : SIEVEDIR_OK;
    d = imapconf_getstring(conf, "configdirectory");
    return buf_printf(out, "%s/sieve", d ? d : "") < 0 ? SIEVEDIR_NOMEM
                                                       : SIEVEDIR_OK;
}

/* Cyrus's dir_hash_c: the letter, lower-cased, or 'q'. */
static char sievedir_hash(char c)
{
    if (c >= 'A' && c <= 'Z')
        return (char)(c - 'A' + 'a');
    if (c >= 'a' && c <= 'z')
        return c;
    return 'q';
}

/* A path component of len bytes: non-empty, not "." or "..", no '/'. */
static int sievedir_part_ok(const char *s, size_t len)
{
    if (len == 0 || memchr(s, '/', len) || memchr(s, '\0', len))
        return 0;
    if ((len == 1 && s[0] == '.') || (len == 2 && s[0] == '.' && s[1] == '.'))
        return 0;
    return 1;
}

int sievedir_user_path(const struct imapconf *conf, const char *userid,
                       struct buf *out)
{
    const char *at;
    size_t ulen;
    int r;

    buf_reset(out);
    if (!userid)
        return SIEVEDIR_BADNAME;
    at = strchr(userid, '@');
    ulen = at ? (size_t)(at - userid) : strlen(userid);
    if (!sievedir_part_ok(userid, ulen) ||
        (at && (!sievedir_part_ok(at + 1, strlen(at + 1)) ||
                strchr(at + 1, '@'))))
        return SIEVEDIR_BADNAME;
    r = sievedir_root(conf, out);
    if (r != SIEVEDIR_OK)
        return r;
    if (at && buf_printf(out, "/domain/%c/%s", sievedir_hash(at[1]),
                         at + 1) < 0)
        goto nomem;
    if (buf_printf(out, "/%c/", sievedir_hash(userid[0])) < 0)
        goto nomem;
    /* a '.' of the user's name is '^' in mailbox names
     * (unixhierarchysep): the directory is named as the user is */
    for (size_t i = 0; i < ulen; i++)
        if (buf_putc(out, userid[i] == '^' ? '.' : userid[i]) < 0)
            goto nomem;
    return SIEVEDIR_OK;
nomem:
    buf_reset(out);
    return SIEVEDIR_NOMEM;
}

int sievedir_active_path(const struct imapconf *conf, const char *userid,
                         struct buf *out)
{
    int r = sievedir_user_path(conf, userid, out);

    if (r == SIEVEDIR_OK &&
        buf_appendcstr(out, "/" SIEVEDIR_ACTIVE_LINK) < 0) {
        buf_reset(out);
        r = SIEVEDIR_NOMEM;
    }
    return r;
}

int sievedir_global_path(const struct imapconf *conf, struct buf *out)
{
    const char *d = imapconf_getstring(conf, "sieve_globaldir");

    if (d && *d) {
        buf_reset(out);
        return buf_setcstr(out, d) < 0 ? SIEVEDIR_NOMEM : SIEVEDIR_OK;
    }
    if (sievedir_root(conf, out) != SIEVEDIR_OK ||
        buf_appendcstr(out, "/global") < 0) {
        buf_reset(out);
        return SIEVEDIR_NOMEM;
    }
    return SIEVEDIR_OK;
}

int sievedir_name_valid(const char *name, size_t len)
{
    if (!name || len == 0 || len > SIEVEDIR_NAME_MAX || name[0] == '.')
        return 0;
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)name[i];

        if (c < 0x20 || c == 0x7f || c == '/')
            return 0;
    }
    return 1;
}

int sievedir_script_path(const char *dir, const char *name,
                         struct buf *out)
{
    buf_reset(out);
    if (!name || !sievedir_name_valid(name, strlen(name)))
        return SIEVEDIR_BADNAME;
    if (buf_printf(out, "%s/%s%s", dir, name, SIEVEDIR_SUFFIX) < 0)
        return SIEVEDIR_NOMEM;
    return SIEVEDIR_OK;
}

/* The script name a link target "NAME.script" stands for, into name:
 * 1, or 0 when the target has another form. */
static int sievedir_target_name(const char *target, struct buf *name)
{
    size_t len = strlen(target);

    if (len <= SIEVEDIR_SUFFIX_LEN ||
        strcmp(target + len - SIEVEDIR_SUFFIX_LEN, SIEVEDIR_SUFFIX) != 0 ||
        !sievedir_name_valid(target, len - SIEVEDIR_SUFFIX_LEN))
        return 0;
    return buf_setmap(name, target, len - SIEVEDIR_SUFFIX_LEN) < 0 ? -1 : 1;
}

int sievedir_active(const char *dir, struct buf *name)
{
    struct buf path = BUF_INITIALIZER;
    char target[SIEVEDIR_NAME_MAX + 64];
    struct stat st;
    ssize_t n;
    int r;

    buf_reset(name);
    if (buf_printf(&path, "%s/%s", dir, SIEVEDIR_ACTIVE_LINK) < 0)
        return SIEVEDIR_NOMEM;
    n = readlink(buf_cstring(&path), target, sizeof(target) - 1);
    if (n < 0) {
        int e = errno;

        buf_free(&path);
        errno = e;
        return (e == ENOENT || e == ENOTDIR) ? 0 : SIEVEDIR_IOERROR;
    }
    target[n] = '\0';
    /* dangling: no active script */
    if (stat(buf_cstring(&path), &st) != 0 || !S_ISREG(st.st_mode)) {
        buf_free(&path);
        return 0;
    }
    buf_free(&path);
    r = sievedir_target_name(target, name);
    if (r < 0)
        return SIEVEDIR_NOMEM;
    return r;
}

int sievedir_list(const char *dir, struct strarray *names,
                  struct buf *active)
{
    DIR *d;
    struct dirent *de;
    int r = SIEVEDIR_OK;

    if (active) {
        buf_reset(active);
        r = sievedir_active(dir, active);
        if (r < 0)
            return r;
        r = SIEVEDIR_OK;
    }
    d = opendir(dir);
    if (!d)
        return (errno == ENOENT || errno == ENOTDIR) ? SIEVEDIR_OK
                                                     : SIEVEDIR_IOERROR;
    while ((de = readdir(d)) != NULL) {
        size_t len = strlen(de->d_name);

        if (len <= SIEVEDIR_SUFFIX_LEN ||
            strcmp(de->d_name + len - SIEVEDIR_SUFFIX_LEN,
                   SIEVEDIR_SUFFIX) != 0 ||
            !sievedir_name_valid(de->d_name, len - SIEVEDIR_SUFFIX_LEN))
            continue;
        de->d_name[len - SIEVEDIR_SUFFIX_LEN] = '\0';
        if (strarray_append(names, de->d_name) < 0) {
            r = SIEVEDIR_NOMEM;
            break;
        }
    }
    closedir(d);
    strarray_sort(names);
    return r;
}

long sievedir_count(const char *dir)
{
    struct strarray names = STRARRAY_INITIALIZER;
    int r = sievedir_list(dir, &names, NULL);
    long n = (long)names.count;

    strarray_fini(&names);
    return r == SIEVEDIR_OK ? n : r;
}

/* The file at path into out (replaced); st_r (NULL: not wanted) its
 * fstat(). */
static int sievedir_read_st(const char *path, size_t max, struct buf *out,
                            struct stat *st_r)
{
    struct stat st;
    int fd;

    buf_reset(out);
    fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT || errno == ENOTDIR ? SIEVEDIR_NOTFOUND
                                                   : SIEVEDIR_IOERROR;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return SIEVEDIR_IOERROR;
    }
    if (max && (size_t)st.st_size > max) {
        close(fd);
        errno = EFBIG;
        return SIEVEDIR_IOERROR;
    }
    if (buf_ensure(out, (size_t)st.st_size + 1) < 0) {
        close(fd);
        return SIEVEDIR_NOMEM;
    }
    if (st.st_size > 0 &&
        fs_pread_all(fd, out->s, (size_t)st.st_size, 0) != 0) {
        close(fd);
        return SIEVEDIR_IOERROR;
    }
    out->len = (size_t)st.st_size;
    out->s[out->len] = '\0';
    close(fd);
    if (st_r)
        *st_r = st;
    return SIEVEDIR_OK;
}

static int sievedir_read(const char *path, size_t max, struct buf *out)
{
    return sievedir_read_st(path, max, out, NULL);
}

int64_t sievedir_mtime_ns(const struct stat *st)
{
    return (int64_t)st->st_mtim.tv_sec * 1000000000 +
           (int64_t)st->st_mtim.tv_nsec;
}

int sievedir_bc_set_source(void *bc, size_t len, const struct stat *st)
{
    return sieve_bc_set_source(bc, len, (uint64_t)st->st_ino,
                               sievedir_mtime_ns(st));
}

int sievedir_bc_is_source(const void *bc, size_t len, const struct stat *st)
{
    uint64_t tl, th, ino;
    int64_t mt;

    return sieve_bc_source(bc, len, &tl, &th, &ino, &mt) == 0 &&
           (ino != 0 || mt != 0) && ino == (uint64_t)st->st_ino &&
           mt == sievedir_mtime_ns(st) && tl == (uint64_t)st->st_size;
}

int sievedir_get_st(const char *dir, const char *name, size_t max,
                    struct buf *out, struct stat *st_r)
{
    struct buf path = BUF_INITIALIZER;
    int r;

    buf_reset(out);
    r = sievedir_script_path(dir, name, &path);
    if (r == SIEVEDIR_OK)
        r = sievedir_read_st(buf_cstring(&path), max, out, st_r);
    buf_free(&path);
    return r;
}

int sievedir_get(const char *dir, const char *name, size_t max,
                 struct buf *out)
{
    return sievedir_get_st(dir, name, max, out, NULL);
}

int sievedir_get_bc(const char *dir, const char *name, size_t max,
                    struct buf *out)
{
    struct buf path = BUF_INITIALIZER;
    int r;

    buf_reset(out);
    r = sievedir_bc_path(dir, name, &path);
    if (r == SIEVEDIR_OK)
        r = sievedir_read(buf_cstring(&path), max, out);
    buf_free(&path);
    return r;
}

/* A temporary name in dir for `what`, unique to this process. */
static int sievedir_tmpname(const char *dir, const char *what,
                            struct buf *out)
{
    static unsigned long counter;

    buf_reset(out);
    return buf_printf(out, "%s/.%s.%ld.%lu.tmp", dir, what, (long)getpid(),
                      ++counter) < 0 ? SIEVEDIR_NOMEM : SIEVEDIR_OK;
}

/* Write data to path (in dir) through a temporary file and a rename;
 * sync: fsync the file and the directory (durable on SIEVEDIR_OK). */
static int sievedir_write(const char *dir, const char *path,
                          const char *what, const char *data, size_t len,
                          int sync)
{
    struct buf tmp = BUF_INITIALIZER;
    int fd = -1, r, e;

    if ((r = sievedir_tmpname(dir, what, &tmp)) != SIEVEDIR_OK)
        goto out;
    r = SIEVEDIR_IOERROR;
    if (fs_mkdir_p(dir, 0750) != 0)
        goto out;
    fd = open(buf_cstring(&tmp), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
              0640);
    if (fd < 0)
        goto out;
    if (fs_write_all(fd, data, len) != 0 || (sync && fsync(fd) != 0))
        goto fail;
    if (close(fd) != 0) {
        fd = -1;
        goto fail;
    }
    fd = -1;
    if (rename(buf_cstring(&tmp), path) != 0)
        goto fail;
    if (sync && fs_fsync_dir(dir) != 0)
        goto out;
    r = SIEVEDIR_OK;
    goto out;
fail:
    e = errno;
    if (fd >= 0)
        close(fd);
    fd = -1;
    unlink(buf_cstring(&tmp));
    errno = e;
out:
    if (fd >= 0)
        close(fd);
    buf_free(&tmp);
    return r;
}

int sievedir_put(const char *dir, const char *name, const char *text,
                 size_t len)
{
    struct buf path = BUF_INITIALIZER;
    int r;

    r = sievedir_script_path(dir, name, &path);
    if (r == SIEVEDIR_OK)
        r = sievedir_write(dir, buf_cstring(&path), "script", text, len, 1);
    buf_free(&path);
    return r;
}

int sievedir_bc_path(const char *dir, const char *name, struct buf *out)
{
    buf_reset(out);
    if (!name || !sievedir_name_valid(name, strlen(name)))
        return SIEVEDIR_BADNAME;
    if (buf_printf(out, "%s/%s%s", dir, name, SIEVEDIR_BC_SUFFIX) < 0)
        return SIEVEDIR_NOMEM;
    return SIEVEDIR_OK;
}

int sievedir_put_bc(const char *dir, const char *name, const char *data,
                    size_t len, int sync)
{
    struct buf path = BUF_INITIALIZER;
    int r;

    r = sievedir_bc_path(dir, name, &path);
    if (r == SIEVEDIR_OK)
        r = sievedir_write(dir, buf_cstring(&path), "bc", data, len, sync);
    buf_free(&path);
    return r;
}

int sievedir_store_bc(const char *dir, const char *name,
                      const struct sieve_script *script, const char *text,
                      size_t len, const struct strarray *allowed,
                      const struct stat *src, int sync)
{
    struct buf bc = BUF_INITIALIZER, cur = BUF_INITIALIZER;
    struct stat st;
    int r;

    r = sieve_bc_encode(script, text, len, allowed, &bc);
    if (r != SIEVE_OK) {
        buf_free(&bc);
        return r == SIEVE_ENOMEM ? SIEVEDIR_NOMEM : SIEVEDIR_BADNAME;
    }
    /* the source identity: the caller's, else that of NAME.script when
     * it holds this text now (else none: loaders read the text) */
    if (!src && sievedir_get_st(dir, name, len + 1, &cur, &st) ==
                    SIEVEDIR_OK &&
        cur.len == len && (len == 0 || memcmp(cur.s, text, len) == 0))
        src = &st;
    if (src)
        sievedir_bc_set_source(bc.s, bc.len, src);
    r = sievedir_put_bc(dir, name, bc.s, bc.len, sync);
    buf_free(&bc);
    buf_free(&cur);
    return r;
}

int sievedir_ensure_bc(const char *dir, const char *name,
                       const struct sieve_limits *limits,
                       const struct strarray *allowed, int sync,
                       int *stored_r, struct buf *err)
{
    struct buf text = BUF_INITIALIZER, bc = BUF_INITIALIZER;
    struct sieve_script *script = NULL;
    struct stat st;
    int r, stored = 0;

    r = sievedir_get_st(dir, name, limits ? limits->max_script_size : 0,
                        &text, &st);
    if (r != SIEVEDIR_OK)
        goto out;
    if (sievedir_get_bc(dir, name, 0, &bc) == SIEVEDIR_OK &&
        sieve_bc_decode(bc.s, bc.len, text.s, text.len, limits, allowed,
                        &script, NULL) == SIEVE_OK) {
        /* current for the text; stored again only to name its source
         * (a form written before the text's last change of identity) */
        if (!sievedir_bc_is_source(bc.s, bc.len, &st)) {
            r = sievedir_store_bc(dir, name, script, text.s, text.len,
                                  allowed, &st, sync);
            stored = 1;
        }
        goto out;
    }
    r = sieve_compile(text.s ? text.s : "", text.len, limits, allowed,
                      &script, err);
    if (r == SIEVE_OK) {
        r = sievedir_store_bc(dir, name, script, text.s, text.len, allowed,
                              &st, sync);
        stored = 1;
    } else {
        r = r == SIEVE_ENOMEM ? SIEVEDIR_NOMEM : SIEVEDIR_BADNAME;
    }
out:
    if (stored_r)
        *stored_r = r == SIEVEDIR_OK && stored;
    sieve_script_free(&script);
    buf_free(&text);
    buf_free(&bc);
    return r;
}

/* The subdirectories of dir, sorted, into subs (replaced); a name of
 * one byte only when one is set.  SIEVEDIR_OK (also for a missing
 * dir: none), SIEVEDIR_IOERROR, SIEVEDIR_NOMEM. */
static int sievedir_subdirs(const char *dir, int one, struct strarray *subs)
{
    struct buf path = BUF_INITIALIZER;
    struct dirent *de;
    struct stat st;
    DIR *d = opendir(dir);
    int r = SIEVEDIR_OK;

    strarray_fini(subs);
    if (!d)
        return errno == ENOENT || errno == ENOTDIR ? SIEVEDIR_OK
                                                   : SIEVEDIR_IOERROR;
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.' || (one && de->d_name[1] != '\0'))
            continue;
        buf_reset(&path);
        if (buf_printf(&path, "%s/%s", dir, de->d_name) < 0 ||
            (lstat(buf_cstring(&path), &st) == 0 && S_ISDIR(st.st_mode) &&
             strarray_append(subs, de->d_name) < 0)) {
            r = SIEVEDIR_NOMEM;
            break;
        }
    }
    closedir(d);
    buf_free(&path);
    strarray_sort(subs);
    return r;
}

/* fn on every directory below dir along `levels`: one character per
 * level, '1' a hash directory (a name of one byte), '*' any name, 'd'
 * the directory "domain" (then the levels after it) */
static int sievedir_walk(const char *dir, const char *levels,
                         sievedir_user_fn *fn, void *rock)
{
    struct strarray subs = STRARRAY_INITIALIZER;
    struct buf path = BUF_INITIALIZER;
    size_t i;
    int r;

    if (!*levels)
        return fn(rock, dir);
    if (*levels == 'd') {
        if (buf_printf(&path, "%s/domain", dir) < 0)
            return SIEVEDIR_NOMEM;
        r = sievedir_walk(buf_cstring(&path), levels + 1, fn, rock);
        buf_free(&path);
        return r;
    }
    r = sievedir_subdirs(dir, *levels == '1', &subs);
    for (i = 0; r == SIEVEDIR_OK && i < subs.count; i++) {
        buf_reset(&path);
        r = buf_printf(&path, "%s/%s", dir, subs.data[i]) < 0
                ? SIEVEDIR_NOMEM
                : sievedir_walk(buf_cstring(&path), levels + 1, fn, rock);
    }
    strarray_fini(&subs);
    buf_free(&path);
    return r;
}

int sievedir_foreach_user(const struct imapconf *conf, sievedir_user_fn *fn,
                          void *rock)
{
    struct buf root = BUF_INITIALIZER;
    int r = sievedir_root(conf, &root);

    /* SIEVEDIR/H/USER, then SIEVEDIR/domain/DH/DOMAIN/H/USER (the
     * layout of sievedir_user_path()) */
    if (r == SIEVEDIR_OK)
        r = sievedir_walk(buf_cstring(&root), "1*", fn, rock);
    if (r == SIEVEDIR_OK)
        r = sievedir_walk(buf_cstring(&root), "d1*1*", fn, rock);
    buf_free(&root);
    return r;
}

/* Point defaultbc at "NAME.script" (NULL: remove it), atomically. */
static int sievedir_link(const char *dir, const char *name)
{
    struct buf link = BUF_INITIALIZER, tmp = BUF_INITIALIZER,
               target = BUF_INITIALIZER;
    int r = SIEVEDIR_NOMEM, e;

    if (buf_printf(&link, "%s/%s", dir, SIEVEDIR_ACTIVE_LINK) < 0)
        goto out;
    if (!name) {
        r = SIEVEDIR_OK;
        if (unlink(buf_cstring(&link)) != 0 && errno != ENOENT)
            r = SIEVEDIR_IOERROR;
        else if (fs_fsync_dir(dir) != 0 && errno != ENOENT)
            r = SIEVEDIR_IOERROR;
        goto out;
    }
    if (buf_printf(&target, "%s%s", name, SIEVEDIR_SUFFIX) < 0 ||
        sievedir_tmpname(dir, SIEVEDIR_ACTIVE_LINK, &tmp) != SIEVEDIR_OK)
        goto out;
    r = SIEVEDIR_IOERROR;
    if (symlink(buf_cstring(&target), buf_cstring(&tmp)) != 0)
        goto out;
    if (rename(buf_cstring(&tmp), buf_cstring(&link)) != 0) {
        e = errno;
        unlink(buf_cstring(&tmp));
        errno = e;
        goto out;
    }
    if (fs_fsync_dir(dir) != 0)
        goto out;
    r = SIEVEDIR_OK;
out:
    buf_free(&link);
    buf_free(&tmp);
    buf_free(&target);
    return r;
}

/* SIEVEDIR_OK when script `name` exists, else NOTFOUND/BADNAME/... */
static int sievedir_exists(const char *dir, const char *name)
{
    struct buf path = BUF_INITIALIZER;
    struct stat st;
    int r = sievedir_script_path(dir, name, &path);

    if (r == SIEVEDIR_OK && lstat(buf_cstring(&path), &st) != 0)
        r = errno == ENOENT || errno == ENOTDIR ? SIEVEDIR_NOTFOUND
                                                : SIEVEDIR_IOERROR;
    else if (r == SIEVEDIR_OK && !S_ISREG(st.st_mode))
        r = SIEVEDIR_NOTFOUND;
    buf_free(&path);
    return r;
}

int sievedir_activate(const char *dir, const char *name)
{
    int r;

    if (!name || !*name)
        return sievedir_link(dir, NULL);
    r = sievedir_exists(dir, name);
    if (r != SIEVEDIR_OK)
        return r;
    return sievedir_link(dir, name);
}

/* 1 when `name` is the active script, 0 when not, or an error. */
static int sievedir_is_active(const char *dir, const char *name)
{
    struct buf active = BUF_INITIALIZER;
    int r = sievedir_active(dir, &active);

    if (r == 1)
        r = strcmp(buf_cstring(&active), name) == 0;
    buf_free(&active);
    return r;
}

int sievedir_delete(const char *dir, const char *name)
{
    struct buf path = BUF_INITIALIZER;
    int r;

    r = sievedir_exists(dir, name);
    if (r != SIEVEDIR_OK)
        return r;
    r = sievedir_is_active(dir, name);
    if (r < 0)
        return r;
    if (r == 1)
        return SIEVEDIR_ACTIVE;
    r = sievedir_script_path(dir, name, &path);
    if (r == SIEVEDIR_OK) {
        if (unlink(buf_cstring(&path)) != 0)
            r = errno == ENOENT ? SIEVEDIR_NOTFOUND : SIEVEDIR_IOERROR;
        else if (sievedir_bc_path(dir, name, &path) == SIEVEDIR_OK &&
                 unlink(buf_cstring(&path)) != 0 && errno != ENOENT)
            r = SIEVEDIR_IOERROR;
        else if (fs_fsync_dir(dir) != 0)
            r = SIEVEDIR_IOERROR;
    }
    buf_free(&path);
    return r;
}

int sievedir_rename(const char *dir, const char *oldname,
                    const char *newname)
{
    struct buf from = BUF_INITIALIZER, to = BUF_INITIALIZER;
    int r, active;

    r = sievedir_exists(dir, oldname);
    if (r != SIEVEDIR_OK)
        return r;
    if ((r = sievedir_script_path(dir, newname, &to)) != SIEVEDIR_OK)
        goto out;
    if ((r = sievedir_script_path(dir, oldname, &from)) != SIEVEDIR_OK)
        goto out;
    active = sievedir_is_active(dir, oldname);
    if (active < 0) {
        r = active;
        goto out;
    }
    /* link(2) refuses an existing new name atomically */
    if (link(buf_cstring(&from), buf_cstring(&to)) != 0) {
        r = errno == EEXIST ? SIEVEDIR_EXISTS
            : errno == ENOENT ? SIEVEDIR_NOTFOUND : SIEVEDIR_IOERROR;
        goto out;
    }
    if (fs_fsync_dir(dir) != 0) {
        r = SIEVEDIR_IOERROR;
        goto out;
    }
    if (active && (r = sievedir_link(dir, newname)) != SIEVEDIR_OK)
        goto out;
    r = SIEVEDIR_OK;
    if (unlink(buf_cstring(&from)) != 0)
        r = SIEVEDIR_IOERROR;
    /* the compiled form follows its script (it names no file) */
    if (r == SIEVEDIR_OK &&
        sievedir_bc_path(dir, oldname, &from) == SIEVEDIR_OK &&
        sievedir_bc_path(dir, newname, &to) == SIEVEDIR_OK &&
        rename(buf_cstring(&from), buf_cstring(&to)) != 0) {
        if (errno != ENOENT)
            unlink(buf_cstring(&from));
        unlink(buf_cstring(&to));
    }
    if (r == SIEVEDIR_OK && fs_fsync_dir(dir) != 0)
        r = SIEVEDIR_IOERROR;
out:
    buf_free(&from);
    buf_free(&to);
    return r;
}
