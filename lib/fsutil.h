/*
 * fsutil.h - small file-system helpers shared by the storage code:
 * complete reads and writes that retry on EINTR and short counts, fcntl
 * record locks, directory sync, and mkdir -p.
 * All return 0 on success and -1 with errno set on failure.
 */
#ifndef LIB_FSUTIL_H
#define LIB_FSUTIL_H

#include <stddef.h>
#include <sys/stat.h>
#include <sys/types.h>

int fs_write_all(int fd, const void *data, size_t len);
int fs_pwrite_all(int fd, const void *data, size_t len, off_t offset);
/* Read exactly len bytes; -1 with errno EIO on a short file. */
int fs_pread_all(int fd, void *data, size_t len, off_t offset);

/* fcntl lock on the whole file.  type: F_RDLCK, F_WRLCK or F_UNLCK.
 * wait != 0 blocks (retrying on EINTR); wait == 0 fails with EAGAIN when
 * another process holds a conflicting lock. */
int fs_lock(int fd, int type, int wait);

/* fsync the directory that holds `path` (path names a file in it). */
int fs_fsync_parent(const char *path);
/* fsync the directory `dir` itself. */
int fs_fsync_dir(const char *dir);

/* Create dir and its missing parents with mode. */
int fs_mkdir_p(const char *dir, int mode);

/* Create the parent directories of the file `path`. */
int fs_mkdir_parent(const char *path, int mode);
/* The same, and each directory it created made durable: the directory
 * holding it fsync()ed (deepest last).  Nothing synced when all existed.
 * 0, or -1 and errno (mkdir or fsync failed). */
int fs_mkdir_parent_synced(const char *path, int mode);

/* fdatasync where available, fsync otherwise. */
int fs_datasync(int fd);

/*
 * stat() and fstat() for a file's identity and size only: st_dev,
 * st_ino, st_mode, st_nlink, st_uid, st_gid, st_rdev, st_size, st_blocks
 * and st_blksize are filled, the times are zero.  Not asking for the times
 * matters on Linux 6.13 and later (multigrain timestamps on ext4, XFS,
 * btrfs, tmpfs): a file whose times were read gets a fine-grained time at
 * its next change, and that moves the floor of every coarse timestamp of
 * the system, so that afterwards each write to ANY file changes its mtime
 * and dirties its inode, where it otherwise would once per clock tick.
 * The delivery path stats an index or a database and then writes it
 * several times per message; with plain stat() the journal file's inode
 * was dirty at every round, and ext4 without a journal writes a dirty
 * inode synchronously in fdatasync() (one more device round trip per
 * round).  Uses statx() without STATX_ATIME/MTIME/CTIME/BTIME, plain
 * stat() where statx() is missing.  0, or -1 and errno.
 */
int fs_stat_id(const char *path, struct stat *st);
int fs_fstat_id(int fd, struct stat *st);

#endif
