/*
 * commit.c - the durable commit path (see commit.h for the interface).
 *
 * A commit batch is a set of open files and of directories; one call of
 * commit_batch_sync() is one "sync round" that makes all of them durable:
 * fsync() of every file in the order it was added, then, for every
 * directory in the order it was added, open + fsync() + close.  Each file
 * and each directory is synced once per round however often it was
 * added.  fsync() and not fdatasync(): a message file that got a new hard
 * link has a changed link count, which is inode metadata.
 *
 * THE DURABILITY ARGUMENT FOR AN APPEND
 *
 * What an append writes, in the order it happens (append.c, mailbox.c):
 *
 *  S  staging (append_stage_open/_write/_close): the message goes into a
 *     new file PARTITION/stage./NN/PID-SEQ-TIME (O_EXCL, 0600), its size,
 *     header size and SHA-1 digest computed while it is written.  Nothing
 *     is synced.  For a mailbox on another partition a second staging
 *     file is made on that partition (a copy of the first), once.
 *  R  reservation (mailbox_append_reserve, per mailbox, under the
 *     mailbox's exclusive lock): uid = uidnext; link(stage, DIR/UID.);
 *     a record with MAILBOX_FLAG_PENDING, the size, header size and
 *     digest is written after the last record; the header (other slot,
 *     new generation, CRC) gets uidnext + 1 and num_records + 1; the
 *     appender takes an exclusive fcntl lock on the record's 128 bytes and
 *     keeps it; the mailbox lock is released.  The index descriptor and
 *     the spool directory DIR go into the transaction's batch, and
 *     append_add() adds the staging file's descriptor.
 *  C  the sync round (append_commit -> commit_batch_sync):
 *       files, in the order added: for each reservation, the mailbox's
 *       cyrus.index (the PENDING record and the header that counts it),
 *       then the staging file the mailbox linked to (the message bytes and
 *       the inode, which is also the inode of every DIR/UID. linked to it:
 *       data and link count of all recipients' copies in one fsync; the
 *       same staging file for ten mailboxes is synced once);
 *       then directories, in the order added: each mailbox spool
 *       directory DIR (its new entry UID.; a directory shared by several
 *       reservations is synced once).
 *     The staging directory is not synced: its entry is never needed
 *     after a crash (the message lives on through DIR/UID.), and the
 *     staging file is unlinked when the delivery is done.  (When DIR is on
 *     another file system than the staging file, which per-partition
 *     staging avoids, mailbox.c copies into DIR/UID. and fsyncs the copy
 *     itself before the reservation returns.)
 *  F  finish (mailbox_append_finish_many, once for all of a message's
 *     reservations): every recipient mailbox exclusively locked in the
 *     global order (mailbox.c, LOCK ORDER); each record loses PENDING, the
 *     visible prefix and the counters (exists, quota_used, highestmodseq)
 *     advance, the record lock is released, each header is written; then
 *     quota.db is told about all of them in ONE transaction
 *     (quota_update_many) while every lock is held; then the locks are
 *     released.  Not synced here: nothing depends on it (see below); the
 *     next change of that mailbox syncs it with its own round.
 *  A  acknowledgement: append_commit() returns STORE_OK after F, and only
 *     then may a front end answer 250 / OK.
 *
 * Why a crash at any instant leaves each message absent or complete, and
 * nothing acknowledged lost ("crash" = the process killed, or the machine
 * losing power with any subset of unsynced writes reaching the disk):
 *
 *  - A reader looks only at the visible prefix, and a record enters it
 *    only at F (after C) or at recovery.  Recovery (every
 *    mailbox_lock(MAILBOX_LOCK_EXCLUSIVE), details at the top of
 *    mailbox.c) treats a PENDING record whose record lock is free (its
 *    appender is dead: fcntl locks vanish with the process) by
 *    verification: the file DIR/UID. must exist with the recorded size and
 *    the SHA-1 digest of its bytes must equal the recorded one; then the
 *    record is committed, after an fsync of the file, DIR and the index
 *    (it becomes visible only once durable), else marked ABORTED and the
 *    file removed.  So whatever part of S, R or C reached the disk, a
 *    message becomes visible only with all of its bytes: absent or
 *    complete.
 *  - Crash during S: only a staging file exists; no mailbox refers to it.
 *  - Crash during R: any subset of {DIR/UID., record, header} may be on
 *    disk.  A torn header slot fails its CRC and the other slot (the
 *    previous state) counts; a header counting a record that is not there
 *    is corrected; a torn record at the end is cut off; a record the
 *    header does not count yet is treated as pending (verified, as above);
 *    a DIR/UID. without a record is stale and replaced by the next
 *    reservation of that uid.  A complete PENDING record whose file
 *    verifies is committed: the message may then appear although it was
 *    never acknowledged (the client retries: at worst a duplicate, never a
 *    loss), which the durability contract allows.
 *  - Crash during C: any subset of steps 1-3 is durable.  Verification
 *    commits exactly the messages whose record, directory entry and bytes
 *    all survived; the others are aborted.  Nothing was acknowledged.
 *  - Crash after C (during F, after F, after A): record, entry and bytes
 *    are on disk.  If the writes of F were lost, the record is still
 *    PENDING with a free lock and verifies, so recovery commits it (or,
 *    when F's header reached the disk but the record rewrite did not,
 *    recovery clears PENDING from a record the header already counts): an
 *    acknowledged message is never lost.
 *  - A failed sync (EIO, ENOSPC) makes commit_batch_sync() fail; the
 *    appender then cancels each reservation (mailbox_append_cancel: the
 *    record marked ABORTED and synced, the file unlinked) and answers 4xx.
 *    If the machine dies before the cancel reaches the disk, recovery
 *    verifies as above: a message either verifies completely or is
 *    aborted, never half visible.
 *  - Quota: usage lives in the index header (quota_used, exists, changed
 *    at F or by recovery); quota.db follows it with absolute, idempotent
 *    updates (quota_update_mailbox / quota_update_many, one transaction
 *    per delivery), re-applied by the next exclusive locker when a crash
 *    or a failed quota transaction came between index and quota.db, so
 *    usage is never skewed.
 *
 * Order inside a round does not matter for this argument (verification
 * covers every combination), which is what lets group commit replace the
 * inside of commit_batch_sync() by one shared round for many processes.
 *
 * Invariants: a batch holds each descriptor and each directory once; the
 * descriptors are borrowed (never closed here); the batch is empty after
 * every commit_batch_sync(), successful or not.  The statistics are per
 * process (after fork() the child continues from the parent's values).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lib/log.h"
#include "store/commit.h"
#include "store/store.h"

struct commit_batch {
    const struct imapconf *conf;   /* borrowed; may be NULL */
    int *fds;
    size_t nfds, fds_alloc;
    char **dirs;
    size_t ndirs, dirs_alloc;
};

static struct commit_stats commit_totals;

int commit_batch_new(const struct imapconf *conf, struct commit_batch **b_r)
{
    struct commit_batch *b;

    *b_r = NULL;
    b = calloc(1, sizeof(*b));
    if (!b)
        return STORE_NOMEM;
    b->conf = conf;
    *b_r = b;
    return STORE_OK;
}

/* Make room for one more element in an array of `size`-byte elements. */
static int commit_grow(void **arr, size_t *alloc, size_t n, size_t size)
{
    size_t nalloc;
    void *p;

    if (n < *alloc)
        return 0;
    nalloc = *alloc ? *alloc * 2 : 8;
    if (nalloc > (size_t)-1 / size)
        return -1;
    p = realloc(*arr, nalloc * size);
    if (!p)
        return -1;
    *arr = p;
    *alloc = nalloc;
    return 0;
}

int commit_batch_add_fd(struct commit_batch *b, int fd)
{
    size_t i;

    if (fd < 0)
        return STORE_INTERNAL;
    for (i = 0; i < b->nfds; i++)
        if (b->fds[i] == fd)
            return STORE_OK;
    if (commit_grow((void **)&b->fds, &b->fds_alloc, b->nfds,
                    sizeof(*b->fds)) != 0)
        return STORE_NOMEM;
    b->fds[b->nfds++] = fd;
    return STORE_OK;
}

int commit_batch_add_dir(struct commit_batch *b, const char *dir)
{
    size_t i;
    char *copy;

    if (!dir || !*dir)
        return STORE_INTERNAL;
    for (i = 0; i < b->ndirs; i++)
        if (strcmp(b->dirs[i], dir) == 0)
            return STORE_OK;
    if (commit_grow((void **)&b->dirs, &b->dirs_alloc, b->ndirs,
                    sizeof(*b->dirs)) != 0)
        return STORE_NOMEM;
    copy = strdup(dir);
    if (!copy)
        return STORE_NOMEM;
    b->dirs[b->ndirs++] = copy;
    return STORE_OK;
}

static int commit_error(int e)
{
    return (e == ENOSPC || e == EDQUOT) ? STORE_NOSPACE : STORE_IOERROR;
}

/* Forget what the batch holds, keeping its memory. */
static void commit_batch_empty(struct commit_batch *b)
{
    size_t i;

    for (i = 0; i < b->ndirs; i++)
        free(b->dirs[i]);
    b->ndirs = 0;
    b->nfds = 0;
}

/*
 * One sync round.  Kept as one function on purpose: group commit across
 * processes replaces its inside (the loops below) and nothing else.  The
 * first failure ends the round: the batch is then not durable as a whole,
 * and the caller cancels what it covered.
 */
int commit_batch_sync(struct commit_batch *b)
{
    size_t i;
    int r = STORE_OK, fd, rc, e;

    if (b->nfds == 0 && b->ndirs == 0)
        return STORE_OK;
    commit_totals.rounds++;

    for (i = 0; i < b->nfds && r == STORE_OK; i++) {
        commit_totals.file_syncs++;
        do
            rc = fsync(b->fds[i]);
        while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            e = errno;
            log_error("commit: fsync failed fd=<%d> error=<%s>", b->fds[i],
                      strerror(e));
            r = commit_error(e);
        }
    }

    for (i = 0; i < b->ndirs && r == STORE_OK; i++) {
        fd = open(b->dirs[i], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) {
            e = errno;
            log_error("commit: directory open failed dir=<%s> error=<%s>",
                      b->dirs[i], strerror(e));
            r = commit_error(e);
            break;
        }
        commit_totals.dir_syncs++;
        do
            rc = fsync(fd);
        while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            e = errno;
            log_error("commit: directory fsync failed dir=<%s> error=<%s>",
                      b->dirs[i], strerror(e));
            r = commit_error(e);
        }
        close(fd);
    }

    commit_batch_empty(b);
    return r;
}

void commit_stats_get(struct commit_stats *st)
{
    *st = commit_totals;
}

void commit_batch_free(struct commit_batch **bp)
{
    struct commit_batch *b = *bp;

    if (!b)
        return;
    commit_batch_empty(b);
    free(b->dirs);
    free(b->fds);
    free(b);
    *bp = NULL;
}
