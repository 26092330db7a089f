/*
 * commit.h - the durable commit path: the one place where the store makes
 * written data durable before anything is acknowledged.
 *
 * A commit batch collects what one operation wrote (message files, index
 * files, the directories that got new entries) and commit_batch_sync()
 * makes all of it durable in one "sync round".  Every append goes through
 * here (append.c), and so do flag and expunge changes (mailbox.c).  Inside
 * a round no ordering is needed: nothing the batch covers is visible to a
 * reader or acknowledged to a client until the round has returned, and
 * recovery (mailbox.c) verifies whatever a crash in the middle of a round
 * left behind.
 *
 * Today a round is: fsync() of each file (data and inode: the link count
 * of a hard-linked message), then fsync() of each directory, each object
 * once, in the order added.  Group commit across processes (one
 * syncfs()/fdatasync round shared by every delivery waiting at that
 * moment) replaces the inside of commit_batch_sync() without touching its
 * callers.
 */
#ifndef STORE_COMMIT_H
#define STORE_COMMIT_H

#include "lib/imapconf.h"

struct commit_batch;

/* STORE_OK or STORE_NOMEM. conf may be NULL (always sync). */
int commit_batch_new(const struct imapconf *conf, struct commit_batch **b_r);

/* Add an open file.  The fd is borrowed: the caller keeps it open until
 * commit_batch_sync() has returned (closing it early could drop the
 * caller's fcntl locks on that file and is a bug).  The same fd twice is
 * kept once.  STORE_OK, STORE_NOMEM, STORE_INTERNAL (fd < 0). */
int commit_batch_add_fd(struct commit_batch *b, int fd);

/* Add a directory whose entries changed (created, linked, renamed,
 * unlinked); the path is copied, duplicates (same string) kept once.
 * STORE_OK, STORE_NOMEM, STORE_INTERNAL (NULL or empty path). */
int commit_batch_add_dir(struct commit_batch *b, const char *dir);

/* Make everything added durable.  STORE_OK; STORE_NOSPACE or
 * STORE_IOERROR when a sync failed (then nothing of the batch may be
 * treated as durable, and the caller must not acknowledge).  The batch is
 * emptied either way and can be reused.  An empty batch is STORE_OK
 * without a round (no counter moves).  The first failing sync ends the
 * round (logged with fd=<> or dir=<> and error=<>); ENOSPC and EDQUOT give
 * STORE_NOSPACE, every other errno STORE_IOERROR.  Not thread-safe: one
 * batch per thread, and the counters assume one thread per process. */
int commit_batch_sync(struct commit_batch *b);

/* Counters of this process since start, for benchmarks and tests (a
 * fork()ed child starts from its parent's values: take differences). */
struct commit_stats {
    unsigned long rounds;       /* commit_batch_sync calls that synced */
    unsigned long file_syncs;   /* fsync/fdatasync calls on files */
    unsigned long dir_syncs;    /* fsync calls on directories */
};
void commit_stats_get(struct commit_stats *st);

void commit_batch_free(struct commit_batch **bp);

#endif
