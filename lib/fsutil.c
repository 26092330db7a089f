/*
 * fsutil.c - file-system helpers; see fsutil.h.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "lib/fsutil.h"

int fs_write_all(int fd, const void *data, size_t len)
{
    const char *p = data;

    while (len) {
        ssize_t n = write(fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

int fs_pwrite_all(int fd, const void *data, size_t len, off_t offset)
{
    const char *p = data;

    while (len) {
        ssize_t n = pwrite(fd, p, len, offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        p += n;
        len -= (size_t)n;
        offset += n;
    }
    return 0;
}

int fs_pread_all(int fd, void *data, size_t len, off_t offset)
{
    char *p = data;

    while (len) {
        ssize_t n = pread(fd, p, len, offset);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (n == 0) {
            errno = EIO;
            return -1;
        }
        p += n;
        len -= (size_t)n;
        offset += n;
    }
    return 0;
}

int fs_lock(int fd, int type, int wait)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = (short)type;
    fl.l_whence = SEEK_SET;
    fl.l_start = 0;
    fl.l_len = 0;
    for (;;) {
        if (fcntl(fd, wait ? F_SETLKW : F_SETLK, &fl) == 0)
            return 0;
        if (errno == EINTR && wait)
            continue;
        if (errno == EACCES)
            errno = EAGAIN;
        return -1;
    }
}

int fs_fsync_dir(const char *dir)
{
    int fd, r, saved;

    fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    r = fsync(fd);
    saved = errno;
    close(fd);
    errno = saved;
    return r;
}

int fs_fsync_parent(const char *path)
{
    char dir[PATH_MAX];
    const char *slash = strrchr(path, '/');
    size_t n;

    if (!slash)
        return fs_fsync_dir(".");
    n = (size_t)(slash - path);
    if (n == 0)
        return fs_fsync_dir("/");
    if (n >= sizeof(dir)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    return fs_fsync_dir(dir);
}

int fs_mkdir_p(const char *dir, int mode)
{
    char path[PATH_MAX];
    size_t len = strlen(dir);
    char *p;

    if (len == 0 || len >= sizeof(path)) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(path, dir, len + 1);
    for (p = path + 1; *p; p++) {
        if (*p != '/')
            continue;
        *p = '\0';
        if (mkdir(path, (mode_t)mode) < 0 && errno != EEXIST)
            return -1;
        *p = '/';
    }
    if (mkdir(path, (mode_t)mode) < 0 && errno != EEXIST)
        return -1;
    return 0;
}

/* The directory part of path into dir: 1, 0 when path has none (no
 * slash, or only the leading one), -1 (ENAMETOOLONG). */
static int fs_parent_of(const char *path, char dir[PATH_MAX])
{
    const char *slash = strrchr(path, '/');
    size_t n;

    if (!slash || slash == path)
        return 0;
    n = (size_t)(slash - path);
    if (n >= PATH_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(dir, path, n);
    dir[n] = '\0';
    return 1;
}

int fs_mkdir_parent(const char *path, int mode)
{
    char dir[PATH_MAX];
    int r = fs_parent_of(path, dir);

    return r <= 0 ? r : fs_mkdir_p(dir, mode);
}

int fs_mkdir_parent_synced(const char *path, int mode)
{
    char dir[PATH_MAX];
    char *p;
    int made = 0, r = fs_parent_of(path, dir);

    if (r <= 0)
        return r;
    for (p = dir + 1; ; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        {
            char c = *p;

            *p = '\0';
            if (mkdir(dir, (mode_t)mode) == 0) {
                made = 1;
            } else if (errno != EEXIST) {
                return -1;
            }
            /* the entry of a directory made here, in its parent */
            if (made && fs_fsync_parent(dir) < 0)
                return -1;
            *p = c;
            if (c == '\0')
                break;
        }
    }
    return 0;
}

int fs_datasync(int fd)
{
#ifdef HAVE_FDATASYNC
    return fdatasync(fd);
#else
    return fsync(fd);
#endif
}

/* statx() without the times (fsutil.h); ENOSYS: the kernel or a seccomp
 * filter refuses statx, use the classic call */
static int fs_statx_id(int dirfd, const char *path, int flags,
                       struct stat *st)
{
    struct statx sx;

    if (statx(dirfd, path, flags,
              STATX_TYPE | STATX_MODE | STATX_NLINK | STATX_UID |
              STATX_GID | STATX_INO | STATX_SIZE | STATX_BLOCKS, &sx) != 0)
        return -1;
    memset(st, 0, sizeof(*st));
    st->st_dev = makedev(sx.stx_dev_major, sx.stx_dev_minor);
    st->st_ino = (ino_t)sx.stx_ino;
    st->st_mode = sx.stx_mode;
    st->st_nlink = sx.stx_nlink;
    st->st_uid = sx.stx_uid;
    st->st_gid = sx.stx_gid;
    st->st_rdev = makedev(sx.stx_rdev_major, sx.stx_rdev_minor);
    st->st_size = (off_t)sx.stx_size;
    st->st_blocks = (blkcnt_t)sx.stx_blocks;
    st->st_blksize = (blksize_t)sx.stx_blksize;
    return 0;
}

int fs_stat_id(const char *path, struct stat *st)
{
    if (fs_statx_id(AT_FDCWD, path, 0, st) == 0)
        return 0;
    return errno == ENOSYS ? stat(path, st) : -1;
}

int fs_fstat_id(int fd, struct stat *st)
{
    if (fs_statx_id(fd, "", AT_EMPTY_PATH, st) == 0)
        return 0;
    return errno == ENOSYS ? fstat(fd, st) : -1;
}
