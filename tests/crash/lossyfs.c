/*
 * lossyfs.c - an LD_PRELOAD library that records every change a process
 * makes to the files below one directory, for the power loss simulator
 * (tests/crash/powerloss.py, which reads the log back and builds what a
 * disk could hold after the power failed).
 *
 * Environment (nothing happens without both):
 *   LOSSYFS_ROOT     absolute path of the watched directory (no trailing
 *                    slash, no symbolic links in it)
 *   LOSSYFS_LOG      the operation log, opened O_APPEND by every process
 *   LOSSYFS_EXCLUDE  optional, colon-separated strings: a file whose
 *                    name (last component) contains one is not recorded
 *                    (files mapped MAP_SHARED and written through the
 *                    mapping, or meaningless after a reboot; the
 *                    simulator leaves them out of the image)
 *
 * Every intercepted call is forwarded to libc's own (dlsym RTLD_NEXT)
 * and, when it succeeded on something below the root, one record is
 * appended to the log with ONE write(2) of the whole record on an
 * O_APPEND descriptor (records of concurrent processes never interleave:
 * a regular file's write holds the inode lock).  A POSIX lock on byte 0
 * of the log (plus a mutex for the threads of one process) is held from
 * before the call until its record is written, so a call and its record
 * are one step for everybody else: the order of the records is an order
 * of the operations that every process agrees with (no process can see
 * a file another one created before that creation is logged), and any
 * prefix of the log is a state the machine was in.
 *
 * A sync gets two records: SYNC_BEGIN before the call and SYNC_END after
 * it (with its result); the lock is not held while it runs.  The
 * simulator takes a sync to cover exactly the operations logged before
 * its BEGIN, and only when its END says it succeeded (a process killed
 * inside a sync: not counted).  An operation whose record follows the
 * BEGIN may in fact have been covered: the simulator may drop a write
 * that was durable, never keep one that was not.
 *
 * Recorded: open/openat/creat with O_CREAT or O_TRUNC (the path, the
 * inode, whether it was created), write/pwrite/writev/pwritev (offset and
 * the bytes; whether the descriptor has O_SYNC/O_DSYNC), ftruncate,
 * truncate, fallocate/posix_fallocate, link, rename, unlink, mkdir,
 * rmdir (and their *at forms), fsync, fdatasync, syncfs, sync,
 * sync_file_range and msync (the last two for information: neither makes
 * anything durable).  Not seen: stores through writable MAP_SHARED
 * mappings (the server has none on durable data: commit.shm, metrics.shm
 * and LMDB's -lock file, which are excluded), and calls glibc makes
 * internally (stdio's writes, remove()): the server writes no durable file
 * through them.
 *
 * The log descriptor is checked (fstat: same inode) before each append
 * and reopened when a program closed or reused its number.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

enum {
    LFS_OPEN = 1,        /* path1; flags: 1 created, 2 truncated */
    LFS_WRITE = 2,       /* off, len, data; flags: 1 synchronous fd */
    LFS_TRUNCATE = 3,    /* off = new size */
    LFS_FALLOCATE = 4,   /* off, len; flags = mode */
    LFS_LINK = 5,        /* path1 -> path2 */
    LFS_RENAME = 6,      /* path1 -> path2; flags = renameat2 flags */
    LFS_UNLINK = 7,      /* path1 */
    LFS_MKDIR = 8,       /* path1 */
    LFS_RMDIR = 9,       /* path1 */
    LFS_SYNC_BEGIN = 10, /* off = sync id; flags = kind */
    LFS_SYNC_END = 11,   /* off = sync id; len = result (0 ok) */
    LFS_INFO = 12        /* sync_file_range, msync: flags = kind */
};

enum { LFS_K_FSYNC = 1, LFS_K_FDATASYNC = 2, LFS_K_SYNCFS = 3,
       LFS_K_SYNC = 4, LFS_K_SFR = 5, LFS_K_MSYNC = 6 };

#define LFS_MAGIC 0x3153464cu /* "LFS1" */

struct lfs_rec {
    uint32_t magic, total, op, pid;
    uint64_t dev, ino;
    int64_t off, len;
    uint32_t flags, p1len, p2len, dlen;
};

static char lfs_root[PATH_MAX];
static size_t lfs_rootlen;
static char lfs_logpath[PATH_MAX];
static char lfs_exclude[1024];
static int lfs_on = -1;
static int lfs_logfd = -1;
static dev_t lfs_logdev;
static ino_t lfs_logino;
static uint64_t lfs_syncid;

#define REAL(name) static __typeof__(name) *real_##name
REAL(open); REAL(open64); REAL(openat); REAL(openat64);
REAL(write); REAL(pwrite); REAL(pwrite64); REAL(writev);
REAL(pwritev); REAL(pwritev64); REAL(pwritev2); REAL(ftruncate);
REAL(ftruncate64); REAL(truncate); REAL(truncate64); REAL(fallocate);
REAL(fallocate64); REAL(posix_fallocate); REAL(posix_fallocate64);
REAL(link); REAL(linkat); REAL(rename); REAL(renameat); REAL(renameat2);
REAL(unlink); REAL(unlinkat); REAL(mkdir); REAL(mkdirat); REAL(rmdir);
REAL(fsync); REAL(fdatasync); REAL(syncfs); REAL(sync);
REAL(sync_file_range); REAL(msync);
static int (*real___open_2)(const char *, int);
static int (*real___open64_2)(const char *, int);
static int (*real___openat_2)(int, const char *, int);
static int (*real___openat64_2)(int, const char *, int);

#define LOAD(name) (real_##name ? (void)0 : \
    (void)(real_##name = (__typeof__(real_##name))dlsym(RTLD_NEXT, #name)))

static void lfs_init(void)
{
    const char *r, *l, *x;

    if (lfs_on >= 0)
        return;
    r = getenv("LOSSYFS_ROOT");
    l = getenv("LOSSYFS_LOG");
    x = getenv("LOSSYFS_EXCLUDE");
    lfs_on = 0;
    if (!r || !l || r[0] != '/' || strlen(r) >= sizeof(lfs_root)
        || strlen(l) >= sizeof(lfs_logpath))
        return;
    strcpy(lfs_root, r);
    lfs_rootlen = strlen(r);
    while (lfs_rootlen > 1 && lfs_root[lfs_rootlen - 1] == '/')
        lfs_root[--lfs_rootlen] = '\0';
    strcpy(lfs_logpath, l);
    if (x && strlen(x) < sizeof(lfs_exclude))
        strcpy(lfs_exclude, x);
    lfs_on = 1;
}

/* The log descriptor, (re)opened when it is not ours any more. */
static int lfs_logfd_get(void)
{
    struct stat st;
    int fd;

    if (lfs_logfd >= 0 && fstat(lfs_logfd, &st) == 0
        && st.st_dev == lfs_logdev && st.st_ino == lfs_logino)
        return lfs_logfd;
    fd = (int)syscall(SYS_openat, AT_FDCWD, lfs_logpath,
                      O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    if (fd < 100) {
        /* out of the way of programs that use small numbers */
        int hi = fcntl(fd, F_DUPFD_CLOEXEC, 100);
        if (hi >= 0) {
            close(fd);
            fd = hi;
        }
    }
    if (fstat(fd, &st) != 0) {
        close(fd);
        return -1;
    }
    lfs_logfd = fd;
    lfs_logdev = st.st_dev;
    lfs_logino = st.st_ino;
    return fd;
}

/* Append one record; errors are ignored (the simulator sees a gap as a
 * dropped operation at worst; the test compares counts with the server's
 * and fails on a short log). */
static void lfs_log(uint32_t op, const struct stat *st, int64_t off,
                    int64_t len, uint32_t flags, const char *p1,
                    const char *p2, const struct iovec *iov, int iovcnt,
                    size_t dlen)
{
    struct lfs_rec h;
    size_t l1 = p1 ? strlen(p1) : 0, l2 = p2 ? strlen(p2) : 0;
    size_t total = sizeof(h) + l1 + l2 + dlen, pos, left;
    char *buf;
    int fd, saved = errno, i;

    fd = lfs_logfd_get();
    if (fd < 0 || total > (size_t)UINT32_MAX)
        goto out;
    buf = malloc(total);
    if (!buf)
        goto out;
    memset(&h, 0, sizeof(h));
    h.magic = LFS_MAGIC;
    h.total = (uint32_t)total;
    h.op = op;
    h.pid = (uint32_t)getpid();
    if (st) {
        h.dev = (uint64_t)st->st_dev;
        h.ino = (uint64_t)st->st_ino;
    }
    h.off = off;
    h.len = len;
    h.flags = flags;
    h.p1len = (uint32_t)l1;
    h.p2len = (uint32_t)l2;
    h.dlen = (uint32_t)dlen;
    memcpy(buf, &h, sizeof(h));
    pos = sizeof(h);
    if (l1) memcpy(buf + pos, p1, l1);
    pos += l1;
    if (l2) memcpy(buf + pos, p2, l2);
    pos += l2;
    left = dlen;
    for (i = 0; i < iovcnt && left > 0; i++) {
        size_t n = iov[i].iov_len < left ? iov[i].iov_len : left;
        memcpy(buf + pos, iov[i].iov_base, n);
        pos += n;
        left -= n;
    }
    (void)syscall(SYS_write, fd, buf, total);
    free(buf);
out:
    errno = saved;
}

static int lfs_excluded(const char *path)
{
    const char *p = lfs_exclude, *end, *base = strrchr(path, '/');

    base = base ? base + 1 : path;
    while (*p) {
        char pat[256];
        size_t n;
        end = strchr(p, ':');
        n = end ? (size_t)(end - p) : strlen(p);
        if (n > 0 && n < sizeof(pat)) {
            memcpy(pat, p, n);
            pat[n] = '\0';
            if (strstr(base, pat))
                return 1;
        }
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

/* 1 when abs (an absolute path) lies below the root (or is it) and is
 * not excluded. */
static int lfs_under(const char *abs)
{
    if (strncmp(abs, lfs_root, lfs_rootlen) != 0)
        return 0;
    if (abs[lfs_rootlen] != '\0' && abs[lfs_rootlen] != '/')
        return 0;
    return !lfs_excluded(abs);
}

/* The absolute form of path relative to dirfd (no normalization: the
 * server names its files by absolute paths).  0 on success. */
static int lfs_abspath(int dirfd, const char *path, char *out, size_t size)
{
    char base[PATH_MAX];

    if (!path)
        return -1;
    if (path[0] == '/') {
        if (strlen(path) >= size)
            return -1;
        strcpy(out, path);
        return 0;
    }
    if (dirfd == AT_FDCWD) {
        if (!getcwd(base, sizeof(base)))
            return -1;
    } else {
        char link[64];
        ssize_t n;
        snprintf(link, sizeof(link), "/proc/self/fd/%d", dirfd);
        n = readlink(link, base, sizeof(base) - 1);
        if (n < 0)
            return -1;
        base[n] = '\0';
    }
    {
        size_t lb = strlen(base), lp = strlen(path);
        if (lb + 1 + lp >= size)
            return -1;
        memcpy(out, base, lb);
        out[lb] = '/';
        memcpy(out + lb + 1, path, lp + 1);
    }
    return 0;
}

/* Is fd a regular file or directory below the root?  Fills st and, when
 * path is not NULL, its path. */
static int lfs_fd_watched(int fd, struct stat *st, char *path, size_t size)
{
    char link[64], buf[PATH_MAX];
    ssize_t n;
    size_t dl = strlen(" (deleted)");

    if (lfs_on <= 0)
        return 0;
    if (fstat(fd, st) != 0 || !(S_ISREG(st->st_mode) || S_ISDIR(st->st_mode)))
        return 0;
    snprintf(link, sizeof(link), "/proc/self/fd/%d", fd);
    n = readlink(link, buf, sizeof(buf) - 1);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    if ((size_t)n > dl && strcmp(buf + n - dl, " (deleted)") == 0)
        buf[n - dl] = '\0';
    if (!lfs_under(buf))
        return 0;
    if (path) {
        size_t l = strlen(buf);
        if (l >= size)
            return 0;
        memcpy(path, buf, l + 1);
    }
    return 1;
}

/* ---- the lock ----
 *
 * A logged operation and its record are one step for every other
 * process: a POSIX lock on byte 0 of the log is held from before the
 * call until its record is appended.  Without it a process could see
 * another's effect (a file it just created) and log its own use of it
 * first.  Syncs do not hold it while they run.  POSIX locks belong to
 * the process: a child does not inherit them, a killed holder loses
 * them. */

static pthread_mutex_t lfs_mutex = PTHREAD_MUTEX_INITIALIZER;

/* fork() in one thread while another holds the mutex: the child would
 * inherit it locked */
static void lfs_atfork_prepare(void) { pthread_mutex_lock(&lfs_mutex); }
static void lfs_atfork_release(void) { pthread_mutex_unlock(&lfs_mutex); }

__attribute__((constructor)) static void lfs_constructor(void)
{
    pthread_atfork(lfs_atfork_prepare, lfs_atfork_release,
                   lfs_atfork_release);
}

static void lfs_lock(int how)
{
    struct flock fl;
    int fd, saved = errno;

    /* threads of one process share POSIX locks: a mutex orders them */
    if (how != F_UNLCK)
        pthread_mutex_lock(&lfs_mutex);
    fd = lfs_logfd_get();
    if (fd >= 0) {
        memset(&fl, 0, sizeof(fl));
        fl.l_type = (short)how;
        fl.l_whence = SEEK_SET;
        fl.l_start = 0;
        fl.l_len = 1;
        while (fcntl(fd, F_SETLKW, &fl) < 0 && errno == EINTR)
            ;
    }
    if (how == F_UNLCK)
        pthread_mutex_unlock(&lfs_mutex);
    errno = saved;
}

/* ---- opens ---- */

/* Before an open: 1 (and the lock taken) when it is to be logged. */
static int lfs_open_pre(int dirfd, const char *path, int flags, char *abs,
                        int *existed)
{
    struct stat st;
    int saved = errno;

    lfs_init();
    if (lfs_on <= 0 || !(flags & (O_CREAT | O_TRUNC))
        || lfs_abspath(dirfd, path, abs, PATH_MAX) != 0 || !lfs_under(abs))
        return 0;
    lfs_lock(F_WRLCK);
    *existed = !(flags & O_CREAT) || (!(flags & O_EXCL)
        && fstatat(dirfd, path, &st, AT_SYMLINK_NOFOLLOW) == 0);
    errno = saved;
    return 1;
}

static int lfs_open_post(int w, const char *abs, int flags, int fd,
                         int existed)
{
    struct stat st;
    uint32_t f = 0;
    int saved = errno;

    if (!w)
        return fd;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
        if (!existed)
            f |= 1;
        if ((flags & O_TRUNC) && (flags & O_ACCMODE) != O_RDONLY)
            f |= 2;
        lfs_log(LFS_OPEN, &st, 0, 0, f, abs, NULL, NULL, 0, 0);
    }
    lfs_lock(F_UNLCK);
    errno = saved;
    return fd;
}

static mode_t lfs_mode(int flags, va_list ap)
{
    if ((flags & O_CREAT) || (flags & O_TMPFILE) == O_TMPFILE)
        return (mode_t)va_arg(ap, int);
    return 0;
}

#define LFS_OPEN_BODY(name, dirfd, call) \
    char abs[PATH_MAX]; \
    int existed = 1, fd, w; \
    LOAD(name); \
    w = lfs_open_pre(dirfd, path, flags, abs, &existed); \
    fd = call; \
    return lfs_open_post(w, abs, flags, fd, existed)

int open(const char *path, int flags, ...)
{
    va_list ap;
    mode_t mode;

    va_start(ap, flags);
    mode = lfs_mode(flags, ap);
    va_end(ap);
    {
        LFS_OPEN_BODY(open, AT_FDCWD, real_open(path, flags, mode));
    }
}

int open64(const char *path, int flags, ...)
{
    va_list ap;
    mode_t mode;

    va_start(ap, flags);
    mode = lfs_mode(flags, ap);
    va_end(ap);
    {
        LFS_OPEN_BODY(open64, AT_FDCWD, real_open64(path, flags, mode));
    }
}

int openat(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    mode_t mode;

    va_start(ap, flags);
    mode = lfs_mode(flags, ap);
    va_end(ap);
    {
        LFS_OPEN_BODY(openat, dirfd, real_openat(dirfd, path, flags, mode));
    }
}

int openat64(int dirfd, const char *path, int flags, ...)
{
    va_list ap;
    mode_t mode;

    va_start(ap, flags);
    mode = lfs_mode(flags, ap);
    va_end(ap);
    {
        LFS_OPEN_BODY(openat64, dirfd,
                      real_openat64(dirfd, path, flags, mode));
    }
}

int __open_2(const char *path, int flags);
int __open_2(const char *path, int flags)
{
    LFS_OPEN_BODY(__open_2, AT_FDCWD, real___open_2(path, flags));
}

int __open64_2(const char *path, int flags);
int __open64_2(const char *path, int flags)
{
    LFS_OPEN_BODY(__open64_2, AT_FDCWD, real___open64_2(path, flags));
}

int __openat_2(int dirfd, const char *path, int flags);
int __openat_2(int dirfd, const char *path, int flags)
{
    LFS_OPEN_BODY(__openat_2, dirfd, real___openat_2(dirfd, path, flags));
}

int __openat64_2(int dirfd, const char *path, int flags);
int __openat64_2(int dirfd, const char *path, int flags)
{
    LFS_OPEN_BODY(__openat64_2, dirfd,
                  real___openat64_2(dirfd, path, flags));
}

int creat(const char *path, mode_t mode)
{
    return open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

int creat64(const char *path, mode_t mode)
{
    return open(path, O_WRONLY | O_CREAT | O_TRUNC, mode);
}

/* ---- data ---- */

/* Before a change through fd: 1 (and the lock taken) when fd is a
 * watched file. */
static int lfs_fd_pre(int fd, struct stat *st)
{
    int saved = errno, w;

    lfs_init();
    w = lfs_fd_watched(fd, st, NULL, 0);
    if (w)
        lfs_lock(F_WRLCK);
    errno = saved;
    return w;
}

static void lfs_fd_post(int w)
{
    if (w)
        lfs_lock(F_UNLCK);
}

static void lfs_wrote(int w, int fd, const struct stat *st,
                      const struct iovec *iov, int iovcnt, ssize_t n,
                      off_t off)
{
    int fl, saved = errno;
    uint32_t f = 0;

    if (!w)
        return;
    if (n > 0) {
        if (off < 0) {
            /* write at the file position: it now lies after the bytes */
            off_t cur = lseek(fd, 0, SEEK_CUR);
            off = cur < 0 ? -1 : cur - n;
        }
        fl = fcntl(fd, F_GETFL);
        if (fl >= 0 && (fl & (O_SYNC | O_DSYNC)))
            f |= 1;
        if (off >= 0)
            lfs_log(LFS_WRITE, st, (int64_t)off, (int64_t)n, f, NULL, NULL,
                    iov, iovcnt, (size_t)n);
    }
    lfs_fd_post(w);
    errno = saved;
}

#define LFS_WRITE_BODY(name, call, iov, iovcnt, off) \
    struct stat st; \
    ssize_t n; \
    int w; \
    LOAD(name); \
    w = lfs_fd_pre(fd, &st); \
    n = call; \
    lfs_wrote(w, fd, &st, iov, iovcnt, n, off); \
    return n

ssize_t write(int fd, const void *buf, size_t count)
{
    struct iovec iov = { (void *)buf, count };
    LFS_WRITE_BODY(write, real_write(fd, buf, count), &iov, 1, -1);
}

ssize_t pwrite(int fd, const void *buf, size_t count, off_t off)
{
    struct iovec iov = { (void *)buf, count };
    LFS_WRITE_BODY(pwrite, real_pwrite(fd, buf, count, off), &iov, 1, off);
}

ssize_t pwrite64(int fd, const void *buf, size_t count, off64_t off)
{
    struct iovec iov = { (void *)buf, count };
    LFS_WRITE_BODY(pwrite64, real_pwrite64(fd, buf, count, off), &iov, 1,
                   (off_t)off);
}

ssize_t writev(int fd, const struct iovec *iov, int iovcnt)
{
    LFS_WRITE_BODY(writev, real_writev(fd, iov, iovcnt), iov, iovcnt, -1);
}

ssize_t pwritev(int fd, const struct iovec *iov, int iovcnt, off_t off)
{
    LFS_WRITE_BODY(pwritev, real_pwritev(fd, iov, iovcnt, off), iov, iovcnt,
                   off);
}

ssize_t pwritev64(int fd, const struct iovec *iov, int iovcnt, off64_t off)
{
    LFS_WRITE_BODY(pwritev64, real_pwritev64(fd, iov, iovcnt, off), iov,
                   iovcnt, (off_t)off);
}

/* RWF_DSYNC / RWF_SYNC would make one write synchronous: the server uses
 * neither; off -1 means the file position */
ssize_t pwritev2(int fd, const struct iovec *iov, int iovcnt, off_t off,
                 int flags)
{
    LFS_WRITE_BODY(pwritev2, real_pwritev2(fd, iov, iovcnt, off, flags),
                   iov, iovcnt, off);
}

static int lfs_changed(int w, int rc, uint32_t op, const struct stat *st,
                       int64_t off, int64_t len, uint32_t flags)
{
    int saved = errno;

    if (w && rc == 0)
        lfs_log(op, st, off, len, flags, NULL, NULL, NULL, 0, 0);
    lfs_fd_post(w);
    errno = saved;
    return rc;
}

#define LFS_FD_BODY(name, call, op, off, len, flags) \
    struct stat st; \
    int w, rc; \
    LOAD(name); \
    w = lfs_fd_pre(fd, &st); \
    rc = call; \
    return lfs_changed(w, rc, op, &st, (int64_t)(off), (int64_t)(len), \
                       (uint32_t)(flags))

int ftruncate(int fd, off_t len)
{
    LFS_FD_BODY(ftruncate, real_ftruncate(fd, len), LFS_TRUNCATE, len, 0,
                0);
}

int ftruncate64(int fd, off64_t len)
{
    LFS_FD_BODY(ftruncate64, real_ftruncate64(fd, len), LFS_TRUNCATE, len,
                0, 0);
}

int fallocate(int fd, int mode, off_t off, off_t len)
{
    LFS_FD_BODY(fallocate, real_fallocate(fd, mode, off, len),
                LFS_FALLOCATE, off, len, mode);
}

int fallocate64(int fd, int mode, off64_t off, off64_t len)
{
    LFS_FD_BODY(fallocate64, real_fallocate64(fd, mode, off, len),
                LFS_FALLOCATE, off, len, mode);
}

/* posix_fallocate returns an error number instead of setting errno */
int posix_fallocate(int fd, off_t off, off_t len)
{
    LFS_FD_BODY(posix_fallocate, real_posix_fallocate(fd, off, len),
                LFS_FALLOCATE, off, len, 0);
}

int posix_fallocate64(int fd, off64_t off, off64_t len)
{
    LFS_FD_BODY(posix_fallocate64, real_posix_fallocate64(fd, off, len),
                LFS_FALLOCATE, off, len, 0);
}

/* ---- names (and truncate by name) ---- */

struct lfs_names {
    char a1[PATH_MAX], a2[PATH_MAX];
    int u1, u2, w, two;
};

/* Before a name operation: n->w = 1 (and the lock taken) when one of
 * its paths lies below the root. */
static void lfs_names_pre(struct lfs_names *n, int fd1, const char *p1,
                          int fd2, const char *p2)
{
    int saved = errno;

    n->w = n->u1 = n->u2 = 0;
    n->two = p2 != NULL;
    lfs_init();
    if (lfs_on <= 0 || lfs_abspath(fd1, p1, n->a1, sizeof(n->a1)) != 0)
        return;
    n->u1 = lfs_under(n->a1);
    if (p2) {
        if (lfs_abspath(fd2, p2, n->a2, sizeof(n->a2)) != 0)
            return;
        n->u2 = lfs_under(n->a2);
    }
    n->w = n->u1 || n->u2;
    if (n->w)
        lfs_lock(F_WRLCK);
    errno = saved;
}

static int lfs_names_post(struct lfs_names *n, int rc, uint32_t op,
                          int64_t off, uint32_t flags)
{
    int two = n->two;
    struct stat st;
    int saved = errno;

    if (!n->w)
        return rc;
    if (rc == 0) {
        memset(&st, 0, sizeof(st));
        /* the inode the (new) name now names */
        if (op != LFS_UNLINK && op != LFS_RMDIR)
            (void)lstat(two ? n->a2 : n->a1, &st);
        lfs_log(op, &st, off, 0, flags, n->u1 ? n->a1 : "",
                two ? (n->u2 ? n->a2 : "") : NULL, NULL, 0, 0);
    }
    lfs_lock(F_UNLCK);
    errno = saved;
    return rc;
}

#define LFS_NAME_BODY(name, fd1, p1, fd2, p2, call, op, flags) \
    struct lfs_names n; \
    int rc; \
    LOAD(name); \
    lfs_names_pre(&n, fd1, p1, fd2, p2); \
    rc = call; \
    return lfs_names_post(&n, rc, op, 0, flags)

int truncate(const char *path, off_t len)
{
    struct lfs_names n;
    int rc;

    LOAD(truncate);
    lfs_names_pre(&n, AT_FDCWD, path, 0, NULL);
    rc = real_truncate(path, len);
    return lfs_names_post(&n, rc, LFS_TRUNCATE, (int64_t)len, 0);
}

int truncate64(const char *path, off64_t len)
{
    struct lfs_names n;
    int rc;

    LOAD(truncate64);
    lfs_names_pre(&n, AT_FDCWD, path, 0, NULL);
    rc = real_truncate64(path, len);
    return lfs_names_post(&n, rc, LFS_TRUNCATE, (int64_t)len, 0);
}

int link(const char *old, const char *new)
{
    LFS_NAME_BODY(link, AT_FDCWD, old, AT_FDCWD, new, real_link(old, new),
                  LFS_LINK, 0);
}

int linkat(int ofd, const char *old, int nfd, const char *new, int flags)
{
    LFS_NAME_BODY(linkat, ofd, old, nfd, new,
                  real_linkat(ofd, old, nfd, new, flags), LFS_LINK, 0);
}

int rename(const char *old, const char *new)
{
    LFS_NAME_BODY(rename, AT_FDCWD, old, AT_FDCWD, new,
                  real_rename(old, new), LFS_RENAME, 0);
}

int renameat(int ofd, const char *old, int nfd, const char *new)
{
    LFS_NAME_BODY(renameat, ofd, old, nfd, new,
                  real_renameat(ofd, old, nfd, new), LFS_RENAME, 0);
}

int renameat2(int ofd, const char *old, int nfd, const char *new,
              unsigned int flags)
{
    LFS_NAME_BODY(renameat2, ofd, old, nfd, new,
                  real_renameat2(ofd, old, nfd, new, flags), LFS_RENAME,
                  flags);
}

int unlink(const char *path)
{
    LFS_NAME_BODY(unlink, AT_FDCWD, path, 0, (const char *)NULL,
                  real_unlink(path), LFS_UNLINK, 0);
}

int unlinkat(int dirfd, const char *path, int flags)
{
    LFS_NAME_BODY(unlinkat, dirfd, path, 0, (const char *)NULL,
                  real_unlinkat(dirfd, path, flags),
                  (flags & AT_REMOVEDIR) ? LFS_RMDIR : LFS_UNLINK, 0);
}

int mkdir(const char *path, mode_t mode)
{
    LFS_NAME_BODY(mkdir, AT_FDCWD, path, 0, (const char *)NULL,
                  real_mkdir(path, mode), LFS_MKDIR, 0);
}

int mkdirat(int dirfd, const char *path, mode_t mode)
{
    LFS_NAME_BODY(mkdirat, dirfd, path, 0, (const char *)NULL,
                  real_mkdirat(dirfd, path, mode), LFS_MKDIR, 0);
}

int rmdir(const char *path)
{
    LFS_NAME_BODY(rmdir, AT_FDCWD, path, 0, (const char *)NULL,
                  real_rmdir(path), LFS_RMDIR, 0);
}

/* ---- syncs ---- */

/* Before a sync of fd (or of everything, fd < 0): a BEGIN record when it
 * concerns the root; returns its id (0: not logged). */
static uint64_t lfs_sync_begin(int fd, uint32_t kind)
{
    struct stat st;
    char path[PATH_MAX];
    uint64_t id;

    lfs_init();
    if (lfs_on <= 0)
        return 0;
    if (fd >= 0) {
        if (kind == LFS_K_SYNCFS) {
            /* any descriptor of the root's file system will do */
            struct stat rst;
            if (fstat(fd, &st) != 0 || stat(lfs_root, &rst) != 0
                || st.st_dev != rst.st_dev)
                return 0;
            path[0] = '\0';
        } else if (!lfs_fd_watched(fd, &st, path, sizeof(path)))
            return 0;
    } else {
        memset(&st, 0, sizeof(st));
        path[0] = '\0';
    }
    id = __atomic_add_fetch(&lfs_syncid, 1, __ATOMIC_SEQ_CST);
    lfs_log(LFS_SYNC_BEGIN, &st, (int64_t)id, 0, kind,
            path[0] ? path : NULL, NULL, NULL, 0, 0);
    return id;
}

static void lfs_sync_end(uint64_t id, int rc)
{
    if (id)
        lfs_log(LFS_SYNC_END, NULL, (int64_t)id, rc == 0 ? 0 : errno, 0,
                NULL, NULL, NULL, 0, 0);
}

int fsync(int fd)
{
    uint64_t id;
    int rc;

    LOAD(fsync);
    id = lfs_sync_begin(fd, LFS_K_FSYNC);
    rc = real_fsync(fd);
    lfs_sync_end(id, rc);
    return rc;
}

int fdatasync(int fd)
{
    uint64_t id;
    int rc;

    LOAD(fdatasync);
    id = lfs_sync_begin(fd, LFS_K_FDATASYNC);
    rc = real_fdatasync(fd);
    lfs_sync_end(id, rc);
    return rc;
}

int syncfs(int fd)
{
    uint64_t id;
    int rc;

    LOAD(syncfs);
    id = lfs_sync_begin(fd, LFS_K_SYNCFS);
    rc = real_syncfs(fd);
    lfs_sync_end(id, rc);
    return rc;
}

void sync(void)
{
    uint64_t id;

    LOAD(sync);
    id = lfs_sync_begin(-1, LFS_K_SYNC);
    real_sync();
    lfs_sync_end(id, 0);
}

int sync_file_range(int fd, off64_t off, off64_t n, unsigned int flags)
{
    struct stat st;
    int rc;

    LOAD(sync_file_range);
    rc = real_sync_file_range(fd, off, n, flags);
    lfs_init();
    if (lfs_fd_watched(fd, &st, NULL, 0))
        lfs_log(LFS_INFO, &st, (int64_t)off, (int64_t)n, LFS_K_SFR, NULL,
                NULL, NULL, 0, 0);
    return rc;
}

int msync(void *addr, size_t len, int flags)
{
    int rc;

    LOAD(msync);
    rc = real_msync(addr, len, flags);
    lfs_init();
    if (lfs_on > 0)
        lfs_log(LFS_INFO, NULL, 0, (int64_t)len, LFS_K_MSYNC, NULL, NULL,
                NULL, 0, 0);
    return rc;
}
