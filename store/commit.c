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
 * The argument above needs only this of a round: when it returns STORE_OK,
 * every file of the batch (data and inode) and every directory entry the
 * batch names is on stable storage, and no write of steps S and R was
 * issued after the round began.  All three modes below are judged by it.
 *
 * THE MODES (imapd.conf spool_sync; NULL configuration = file)
 *
 *  file  fsync() of each file, then open + fsync() + close of each
 *        directory, as described at the top (1 + 2N syncs for a delivery
 *        to N mailboxes, each a journal commit and a disk cache flush).
 *  off   nothing is synced; the counters count the commit.  UNSAFE: the
 *        "crash" above then only covers a killed process (the page cache
 *        survives it), not the machine.
 *  group one syncfs() per file system, shared by every committer waiting
 *        at that moment on that file system, in every process.
 *  journal  appends (append.c) write one redo record to the partition's
 *        journal and share one fdatasync() of it (journal.c, which has
 *        its own crash argument and uses the rounds below with
 *        fdatasync() and the journal state of commit.shm); a batch
 *        marked commit_batch_own_files() (a mailbox's index after
 *        STORE, EXPUNGE and the like) is synced as "file": in this mode
 *        the file system holds many dirty spool pages written lazily on
 *        purpose, and a syncfs() would write all of them back for one
 *        flag change; every other batch, and an append the journal
 *        cannot take, is synced as "group".
 *
 * GROUP COMMIT: THE SHARED STATE
 *
 * CONFIGDIR/commit.shm, struct commit_shm below: magic, version, size,
 * the boot id (/proc/sys/kernel/random/boot_id) of the boot that made it,
 * a process-shared robust pthread mutex, counters (64-bit, changed with
 * atomic adds), and COMMIT_SHM_SLOTS slots, one per file system (st_dev)
 * that ever had a group commit, each with: started (rounds begun),
 * done (rounds finished or abandoned), leader (pid of the active round's
 * leader, 0 = none; invariant: leader != 0 exactly when started ==
 * done + 1), fail_round/fail_errno (the last round whose sync failed),
 * abandoned_round (the last round given up because its leader died) and
 * wake, a futex word bumped (and woken) whenever a round ends.
 * Every field of a slot changes only with the mutex held.
 *
 * Set-up: open(O_CREAT, 0600), then an exclusive fcntl lock on the file,
 * then: the same inode as the path still names (else start again: somebody
 * replaced it); size 0 = new: posix_fallocate (so that no page of the
 * mapping can fault with ENOSPC later), map, initialize, store the magic
 * last; the right size, magic, version, layout size and boot id = use it;
 * anything else (damaged, short, another layout, an earlier boot, whose
 * mutex may name a thread of the old boot as owner) = build a new file
 * beside it and rename() it over the path, so that a process still using
 * the old inode keeps a consistent (if lonely) coordinator.  The mapping
 * is MAP_SHARED and kept for the life of the process, one per
 * configdirectory; a fork()ed child uses the inherited mapping (it is the
 * same shared memory), and never holds the mutex, since nothing here
 * forks while holding it.
 *
 * Waiting uses a futex on the slot's wake word, not a pthread condition
 * variable: with glibc 2.36 a process-shared condvar is not robust against
 * a waiter that is SIGKILLed in pthread_cond_wait (its group reference is
 * never dropped and a later pthread_cond_broadcast blocks forever while
 * holding the mutex; observed here), and workers are killed at random in
 * production and in the crash tests.  A killed futex waiter leaves no
 * state behind.
 *
 * GROUP COMMIT: ONE ROUND
 *
 * A committer has done all its writes (S and R: data in the page cache,
 * directory entries in the in-memory file system) before it calls
 * commit_batch_sync().  It syncs nothing per file.  It finds the file
 * systems of its batch (fstat of each descriptor, stat of each directory)
 * and, for each of them in turn, takes the mutex ("arrival") and sets
 *     target = started + 1.
 * A round counts in `started` from the moment it begins (before its
 * syncfs() is called), so every round numbered >= target begins after the
 * arrival, hence after all of the committer's writes; a round already
 * running at the arrival has a number <= started and never counts.  Then,
 * in a loop under the mutex:
 *   - done >= target (round `target` has finished; rounds of one slot run
 *     one at a time, in order): if fail_round >= target the commit fails
 *     with fail_errno (conservative: a later failure also fails it); else
 *     if abandoned_round >= target, target = abandoned_round + 1 (that
 *     round, too, begins after the arrival, and is not the abandoned
 *     one); else round `target` succeeded: done.
 *   - no active round (leader == 0): then started == done == target - 1,
 *     and the committer becomes the leader of round `target`: started++,
 *     leader = its pid, unlock, syncfs() on one of its own descriptors on
 *     that file system (a directory of the batch opened for it when the
 *     batch holds no file there), lock, done = target, record a failure,
 *     leader = 0, wake++ and FUTEX_WAKE everybody (the system call only
 *     when `waiters`, counted under the mutex by each process from its
 *     look at wake to its return from FUTEX_WAIT, is not 0: a waiter that
 *     read wake before the bump is counted, so none sleeps through it;
 *     a bump after its read makes its FUTEX_WAIT return at once).  The leader's own
 *     result is its syncfs()'s.
 *   - else wait: unlock, FUTEX_WAIT on wake for at most 50 ms, lock.  If
 *     the round's leader still has not finished and kill(leader, 0) says
 *     ESRCH, the leader died: the round is abandoned (done = started,
 *     abandoned_round = that round, leader = 0, wake) and whoever waited
 *     for it retargets to the next round, which some waiter leads.
 * A committer that dies while holding the mutex leaves it to the next
 * locker with EOWNERDEAD: that locker repairs every slot (an active round
 * whose leader is dead, or a started round without leader, is abandoned)
 * and calls pthread_mutex_consistent().
 *
 * Why one syncfs() by the leader makes the follower's files, index and
 * directory entries durable: the slot is per st_dev, so the leader's
 * descriptor is on the same file system (super block) as the follower's
 * files and directories.  syncfs() is sync(2) restricted to that super
 * block: it writes back every dirty page and every dirty inode of the
 * file system, whoever dirtied them, waits for that writeback, and then
 * has the file system commit its journal (->sync_fs with wait, which on
 * ext4 and XFS also flushes the disk's write cache) and flushes the block
 * device.  The follower's writes (message bytes, the staging file's inode
 * with its link count, the index records and header, the new directory
 * entries, which are metadata of the directory inodes and go through the
 * same journal) were all complete before its arrival, and its round began
 * after its arrival, so they are among what that syncfs() wrote back and
 * committed.  Hence when round `target` has succeeded the follower's batch
 * is exactly as durable as after the "file" round; and since the follower
 * returns only then, "no write of S or R after the round began" and the
 * ordering argument above hold unchanged.  Coalescing is the whole gain:
 * everybody who arrived while a round ran shares the next one, so with P
 * concurrent committers a round costs one journal commit instead of up to
 * P x (1 + 2N) fsyncs.
 *
 * Errors.  syncfs() reports (Linux >= 5.8) an error of writeback anywhere
 * on the file system that happened since the leader's descriptor was
 * opened (the super block's errseq against the file's f_sb_err), plus
 * failures of the journal commit itself.  That covers every error that
 * happened during the round, so a failed syncfs() fails every member of
 * the round (STORE_IOERROR, or STORE_NOSPACE for ENOSPC/EDQUOT, as
 * "file" does).  It does not cover a writeback error on a follower's file
 * that happened BEFORE the leader's descriptor was opened (background
 * writeback between the follower's write and the round), nor one that
 * another descriptor's syncfs()/fsync() already consumed.  Therefore each
 * member, after its rounds, also asks the kernel about its own files:
 * sync_file_range(fd, 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE) waits for
 * writeback still in flight and returns the file's own errseq error since
 * that descriptor was opened or last checked (the check fsync() makes;
 * it issues no I/O and no cache flush, the syncfs() did that).  A failure
 * there fails the commit like a failed fsync().  On kernels before 5.8
 * syncfs() returns 0 even after writeback errors; the per-file check is
 * then what catches data errors.
 *
 * Counters: commits, syncfs calls, file and directory fsyncs, rounds
 * started/done/failed/abandoned, repairs and fallbacks are summed in the
 * shared file with atomic adds; commit_stats_get() stays per process.
 *
 * Invariants: a batch holds each descriptor and each directory once; the
 * descriptors are borrowed (never closed here); the batch is empty after
 * every commit_batch_sync(), successful or not.  The statistics of
 * commit_stats_get() are per process (after fork() the child continues
 * from the parent's values).  Not thread-safe (one committing thread per
 * process: the test hooks, the mapping list and the counters are plain
 * statics).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "lib/log.h"
#include "lib/procid.h"
#include "store/commit.h"
#include "store/store.h"

struct commit_batch {
    const struct imapconf *conf;   /* borrowed; may be NULL */
    int *fds;
    size_t nfds, fds_alloc;
    char **dirs;
    size_t ndirs, dirs_alloc;
    int own_files;                 /* journal mode: sync as "file" */
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

void commit_batch_own_files(struct commit_batch *b)
{
    b->own_files = 1;
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

/* ---- the shared state ------------------------------------------------ */

#define COMMIT_SHM_NAME "commit.shm"
#define COMMIT_SHM_MAGIC 0x43474331u      /* "CGC1" */
#define COMMIT_SHM_VERSION 4u
#define COMMIT_SHM_SLOTS 16
#define COMMIT_JOURNAL_SLOTS 16
/* the round slot of a journal file: a key no st_dev has (top bit) */
#define COMMIT_JOURNAL_KEY(dev, ino) \
    ((1ULL << 63) | (((uint64_t)(dev) << 40) ^ (uint64_t)(ino)))
#define COMMIT_BOOT_ID_LEN 40
#define COMMIT_WAIT_NS (50 * 1000 * 1000L)  /* a follower's look at the leader */
#define COMMIT_OPEN_TRIES 8

enum commit_mode {
    COMMIT_MODE_GROUP = 0,    /* the order of imapconf's spool_sync words */
    COMMIT_MODE_FILE = 1,
    COMMIT_MODE_OFF = 2,
    COMMIT_MODE_JOURNAL = 3   /* appends: journal.c; other batches: group
                                 (own_files: file) */
};

struct commit_shm_slot {
    uint64_t dev;             /* st_dev of the file system */
    uint32_t used;            /* 1 once claimed (never released) */
    int32_t leader;           /* pid of the active round's leader, 0 = none */
    uint64_t started;         /* rounds begun */
    uint64_t done;            /* rounds finished or abandoned */
    uint64_t fail_round;      /* last round whose sync failed, 0 = none */
    uint64_t abandoned_round; /* last round whose leader died, 0 = none */
    int32_t fail_errno;       /* errno of fail_round */
    uint32_t wake;            /* futex word: +1 whenever a round ends */
    uint32_t waiters;         /* processes between their look at wake and
                               * the end of their FUTEX_WAIT (a killed one
                               * stays counted: a wake too many, never one
                               * too few) */
    uint32_t pad;
};

struct commit_shm {
    uint32_t magic;           /* COMMIT_SHM_MAGIC, stored last at init */
    uint32_t version;
    uint32_t size;            /* sizeof(struct commit_shm) */
    uint32_t pad;
    char boot_id[COMMIT_BOOT_ID_LEN];
    pthread_mutex_t mutex;    /* process-shared, robust */
    uint64_t commits, syncfs_calls, file_syncs, dir_syncs;
    uint64_t rounds_failed, rounds_abandoned, repairs, fallbacks;
    uint64_t journal_syncs, journal_records, checkpoints;
    struct commit_shm_slot slots[COMMIT_SHM_SLOTS];
    struct commit_journal_state journals[COMMIT_JOURNAL_SLOTS];
};

/* One mapping per configdirectory, for the life of the process. */
struct commit_shm_map {
    struct commit_shm_map *next;
    char *path;               /* CONFIGDIR/commit.shm */
    struct commit_shm *shm;
    pid_t pid;                /* the process that mapped it */
};

static struct commit_shm_map *commit_maps;
static pid_t commit_warned_pid;     /* the fallback warning, once per process */
static struct commit_test_hooks commit_hooks;

#define COMMIT_ADD(field) __atomic_add_fetch(&(field), 1, __ATOMIC_RELAXED)
#define COMMIT_LOAD(field) __atomic_load_n(&(field), __ATOMIC_RELAXED)
#define COMMIT_STORE(field, v) __atomic_store_n(&(field), (v), __ATOMIC_RELAXED)

void commit_test_set_hooks(const struct commit_test_hooks *h)
{
    if (h)
        commit_hooks = *h;
    else
        memset(&commit_hooks, 0, sizeof(commit_hooks));
}

static int commit_mode_of(const struct imapconf *conf)
{
    if (!conf)
        return COMMIT_MODE_FILE;
    switch (imapconf_getenum(conf, "spool_sync")) {
    case 1: return COMMIT_MODE_FILE;
    case 2: return COMMIT_MODE_OFF;
    case 3: return COMMIT_MODE_JOURNAL;
    default: return COMMIT_MODE_GROUP;
    }
}

/* This boot's id into buf (COMMIT_BOOT_ID_LEN bytes, NUL-padded); all NUL
 * when /proc does not tell (then a file from an earlier boot cannot be
 * told from a current one: without /proc, remove commit.shm at boot). */
static void commit_boot_id(char *buf)
{
    ssize_t n;
    int fd;

    memset(buf, 0, COMMIT_BOOT_ID_LEN);
    fd = open("/proc/sys/kernel/random/boot_id", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    n = read(fd, buf, COMMIT_BOOT_ID_LEN - 1);
    close(fd);
    if (n < 0)
        n = 0;
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\0'))
        n--;
    memset(buf + n, 0, (size_t)(COMMIT_BOOT_ID_LEN - n));
}

static int commit_shm_valid(const struct commit_shm *shm, const char *boot_id)
{
    return __atomic_load_n(&shm->magic, __ATOMIC_ACQUIRE) == COMMIT_SHM_MAGIC &&
           shm->version == COMMIT_SHM_VERSION &&
           shm->size == sizeof(struct commit_shm) &&
           memcmp(shm->boot_id, boot_id, COMMIT_BOOT_ID_LEN) == 0;
}

/* Allocate, map and initialize the empty file fd.  0 or an errno. */
static int commit_shm_init(int fd, const char *boot_id,
                           struct commit_shm **shm_r)
{
    pthread_mutexattr_t ma;
    struct commit_shm *shm;
    void *p;
    int e;

    *shm_r = NULL;
    if (ftruncate(fd, 0) < 0)
        return errno;
    e = posix_fallocate(fd, 0, (off_t)sizeof(struct commit_shm));
    if (e)
        return e;
    p = mmap(NULL, sizeof(struct commit_shm), PROT_READ | PROT_WRITE,
             MAP_SHARED, fd, 0);
    if (p == MAP_FAILED)
        return errno;
    shm = p;
    memset(shm, 0, sizeof(*shm));
    if ((e = pthread_mutexattr_init(&ma)) != 0)
        goto fail;
    e = pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    if (!e)
        e = pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    if (!e)
        e = pthread_mutex_init(&shm->mutex, &ma);
    pthread_mutexattr_destroy(&ma);
    if (e)
        goto fail;
    shm->version = COMMIT_SHM_VERSION;
    shm->size = sizeof(struct commit_shm);
    memcpy(shm->boot_id, boot_id, COMMIT_BOOT_ID_LEN);
    __atomic_store_n(&shm->magic, COMMIT_SHM_MAGIC, __ATOMIC_RELEASE);
    *shm_r = shm;
    return 0;
fail:
    munmap(p, sizeof(struct commit_shm));
    return e;
}

/* Build a fresh file beside `path` and rename it over `path` (the caller
 * holds the fcntl lock of the file that path named).  0 or an errno. */
static int commit_shm_replace(const char *path, const char *boot_id,
                              struct commit_shm **shm_r)
{
    char tmp[PATH_MAX];
    int fd, e;

    if (snprintf(tmp, sizeof(tmp), "%s.%ld.new", path, (long)getpid()) >=
        (int)sizeof(tmp))
        return ENAMETOOLONG;
    unlink(tmp);
    fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return errno;
    e = commit_shm_init(fd, boot_id, shm_r);
    if (!e && rename(tmp, path) < 0) {
        e = errno;
        munmap(*shm_r, sizeof(struct commit_shm));
        *shm_r = NULL;
    }
    if (e)
        unlink(tmp);
    close(fd);
    return e;
}

/*
 * Open and map CONFIGDIR/commit.shm as the top of commit.c describes.
 * create = 0: only an existing valid file (ENOENT when missing or from an
 * earlier boot, EBADMSG when damaged).  0 and *shm_r, or an errno.
 */
static int commit_shm_open(const char *path, int create,
                           struct commit_shm **shm_r)
{
    char boot_id[COMMIT_BOOT_ID_LEN];
    struct commit_shm *shm;
    struct flock fl;
    struct stat st, pst;
    int fd, e = 0, tries, rc;
    void *p;

    *shm_r = NULL;
    commit_boot_id(boot_id);
    for (tries = 0; tries < COMMIT_OPEN_TRIES; tries++) {
        fd = open(path, O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0600);
        if (fd < 0)
            return errno;
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        do
            rc = fcntl(fd, F_SETLKW, &fl);
        while (rc < 0 && errno == EINTR);
        if (rc < 0 || fstat(fd, &st) < 0) {
            e = errno;
            close(fd);
            return e;
        }
        if (stat(path, &pst) < 0 || pst.st_ino != st.st_ino ||
            pst.st_dev != st.st_dev) {
            close(fd);          /* replaced meanwhile: open the new one */
            continue;
        }
        if (st.st_size == 0 && create) {
            e = commit_shm_init(fd, boot_id, shm_r);
        } else if (st.st_size == (off_t)sizeof(struct commit_shm)) {
            p = mmap(NULL, sizeof(struct commit_shm), PROT_READ | PROT_WRITE,
                     MAP_SHARED, fd, 0);
            if (p == MAP_FAILED) {
                e = errno;
            } else {
                shm = p;
                if (commit_shm_valid(shm, boot_id)) {
                    *shm_r = shm;
                } else {
                    int stale = __atomic_load_n(&shm->magic, __ATOMIC_ACQUIRE) ==
                                    COMMIT_SHM_MAGIC &&
                                shm->version == COMMIT_SHM_VERSION &&
                                shm->size == sizeof(struct commit_shm);

                    munmap(p, sizeof(struct commit_shm));
                    if (!create) {
                        e = stale ? ENOENT : EBADMSG;
                    } else {
                        log_warning("commit: shared state %s, replaced "
                                    "file=<%s>", stale ? "from an earlier "
                                    "boot" : "damaged or of another layout",
                                    path);
                        e = commit_shm_replace(path, boot_id, shm_r);
                    }
                }
            }
        } else if (!create) {
            e = EBADMSG;
        } else {
            log_warning("commit: shared state has a wrong size, replaced "
                        "file=<%s> size=<%lld>", path, (long long)st.st_size);
            e = commit_shm_replace(path, boot_id, shm_r);
        }
        close(fd);              /* drops the fcntl lock; the mapping stays */
        return e;
    }
    return EAGAIN;
}

/* CONFIGDIR/commit.shm into buf; -1 when configdirectory is not set. */
static int commit_shm_path(const struct imapconf *conf, char *buf, size_t len)
{
    const char *dir = imapconf_getstring(conf, "configdirectory");

    if (!dir || !*dir)
        return -1;
    if (snprintf(buf, len, "%s/%s", dir, COMMIT_SHM_NAME) >= (int)len)
        return -1;
    return 0;
}

static struct commit_shm_map *commit_map_find(const char *path)
{
    struct commit_shm_map *m;

    for (m = commit_maps; m; m = m->next)
        if (strcmp(m->path, path) == 0) {
            m->pid = procid_get();   /* inherited across fork(): still shared */
            return m;
        }
    return NULL;
}

static struct commit_shm *commit_map_add(const char *path,
                                         struct commit_shm *shm)
{
    struct commit_shm_map *m = calloc(1, sizeof(*m));

    if (!m || !(m->path = strdup(path))) {
        free(m);
        munmap(shm, sizeof(*shm));
        return NULL;
    }
    m->shm = shm;
    m->pid = getpid();
    m->next = commit_maps;
    commit_maps = m;
    return shm;
}

/* The mapping for conf (created on demand), or NULL with *err_r set (0
 * when configdirectory is not set). */
static struct commit_shm *commit_shm_get(const struct imapconf *conf,
                                         int *err_r)
{
    char path[PATH_MAX];
    struct commit_shm_map *m;
    struct commit_shm *shm;

    *err_r = 0;
    {
        /* the common case, several times per delivery: a mapping made
         * already, found without formatting its path */
        const char *dir = imapconf_getstring(conf, "configdirectory");
        size_t dlen = dir ? strlen(dir) : 0;

        for (m = commit_maps; dlen && m; m = m->next)
            if (strncmp(m->path, dir, dlen) == 0 && m->path[dlen] == '/' &&
                strcmp(m->path + dlen + 1, COMMIT_SHM_NAME) == 0) {
                m->pid = procid_get();
                return m->shm;
            }
    }
    if (commit_shm_path(conf, path, sizeof(path)) < 0)
        return NULL;
    if ((m = commit_map_find(path)) != NULL)
        return m->shm;
    if ((*err_r = commit_shm_open(path, 1, &shm)) != 0)
        return NULL;
    if (!(shm = commit_map_add(path, shm)))
        *err_r = ENOMEM;
    return shm;
}

/* One warning per process when group commit falls back to "file". */
static void commit_fallback_warning(const char *why, int e)
{
    if (commit_warned_pid == getpid())
        return;
    commit_warned_pid = getpid();
    log_warning("commit: group commit unavailable, syncing per file "
                "reason=<%s> error=<%s>", why, e ? strerror(e) : "none");
}

static int commit_pid_alive(pid_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
}

/* The end of a round on slot sl: bump wake, and wake the processes that
 * wait on it, if any (a FUTEX_WAKE nobody waits for is a system call
 * saved per round).  Mutex held. */
static void commit_slot_wake(struct commit_shm_slot *sl)
{
    __atomic_add_fetch(&sl->wake, 1, __ATOMIC_RELEASE);
    if (sl->waiters)
        syscall(SYS_futex, &sl->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

/* Give up slot sl's active round (its leader died).  Mutex held. */
static void commit_slot_abandon(struct commit_shm *shm,
                                struct commit_shm_slot *sl)
{
    uint64_t round = sl->started;

    if (sl->done < round) {
        COMMIT_STORE(sl->done, round);
        sl->abandoned_round = round;
        COMMIT_ADD(shm->rounds_abandoned);
    }
    sl->leader = 0;
    commit_slot_wake(sl);
}

/* After EOWNERDEAD: make every slot consistent again.  Mutex held. */
static void commit_shm_repair(struct commit_shm *shm)
{
    struct commit_shm_slot *sl;
    int i;

    for (i = 0; i < COMMIT_SHM_SLOTS; i++) {
        sl = &shm->slots[i];
        if (!sl->used)
            continue;
        if (sl->done > sl->started)
            COMMIT_STORE(sl->done, sl->started);
        if ((sl->leader != 0 && !commit_pid_alive(sl->leader)) ||
            (sl->leader == 0 && sl->started != sl->done) ||
            (sl->leader != 0 && sl->started == sl->done))
            commit_slot_abandon(shm, sl);
    }
    COMMIT_ADD(shm->repairs);
}

/* Lock the shared mutex; 0 or an errno (ENOTRECOVERABLE). */
static int commit_shm_lock(struct commit_shm *shm)
{
    int rc = pthread_mutex_lock(&shm->mutex);

    if (rc == EOWNERDEAD) {
        log_warning("commit: a process died holding the group commit lock, "
                    "state repaired");
        commit_shm_repair(shm);
        rc = pthread_mutex_consistent(&shm->mutex);
    }
    return rc;
}

static void commit_shm_unlock(struct commit_shm *shm)
{
    pthread_mutex_unlock(&shm->mutex);
}

/* The slot of file system dev (claimed when new); -1 when the table is
 * full.  Mutex held. */
static int commit_slot_find(struct commit_shm *shm, uint64_t dev)
{
    int i;

    for (i = 0; i < COMMIT_SHM_SLOTS; i++)
        if (shm->slots[i].used && shm->slots[i].dev == dev)
            return i;
    for (i = 0; i < COMMIT_SHM_SLOTS; i++)
        if (!shm->slots[i].used) {
            shm->slots[i].dev = dev;
            shm->slots[i].used = 1;
            return i;
        }
    return -1;
}

/*
 * One group round on slot si for a committer whose writes are done (the
 * protocol at the top).  fd: the committer's descriptor on that file
 * system for syncfs().  Mutex held on entry and on return.  0 when a
 * round that began after the arrival succeeded, else the errno.
 */
static int commit_group_round(struct commit_shm *shm, int si, int fd,
                              int datasync)
{
    struct commit_shm_slot *sl = &shm->slots[si];
    struct timespec ts = { 0, COMMIT_WAIT_NS };
    uint64_t target = sl->started + 1, round;
    uint32_t seq;
    pid_t leader, self = procid_get();
    int rc, e, joined = 0;

    for (;;) {
        if (sl->done >= target) {
            if (sl->fail_round >= target) {
                e = sl->fail_errno ? sl->fail_errno : EIO;
                break;
            }
            if (sl->abandoned_round >= target) {
                /* every round numbered >= target began after the
                 * arrival; the one after the last abandoned one has not
                 * been abandoned */
                target = sl->abandoned_round + 1;
                continue;
            }
            e = 0;
            break;
        }
        if (sl->leader == 0) {
            /* lead round `target` (started == done == target - 1) */
            round = sl->started + 1;
            sl->leader = self;
            COMMIT_STORE(sl->started, round);
            commit_shm_unlock(shm);
            e = commit_hooks.before_syncfs ?
                    commit_hooks.before_syncfs(commit_hooks.arg) : 0;
            if (!e) {
                commit_totals.rounds_led++;
                if (datasync) {
                    COMMIT_ADD(shm->journal_syncs);
                    do
                        rc = fdatasync(fd);
                    while (rc < 0 && errno == EINTR);
                } else {
                    COMMIT_ADD(shm->syncfs_calls);
                    do
                        rc = syncfs(fd);
                    while (rc < 0 && errno == EINTR);
                }
                e = rc < 0 ? errno : 0;
            }
            if (commit_shm_lock(shm) != 0)
                return e ? e : ENOTRECOVERABLE;
            if (sl->leader == self && sl->started == round) {
                if (e) {
                    sl->fail_round = round;
                    sl->fail_errno = e;
                    COMMIT_ADD(shm->rounds_failed);
                }
                COMMIT_STORE(sl->done, round);
                sl->leader = 0;
                commit_slot_wake(sl);
            }
            /* else the round was given up for dead (a pid the others could
             * not see); the own syncfs() still covers the own writes */
            return e;
        }
        /* a round is running: wait for its end */
        joined = 1;
        leader = sl->leader;
        round = sl->started;
        seq = __atomic_load_n(&sl->wake, __ATOMIC_ACQUIRE);
        sl->waiters++;
        commit_shm_unlock(shm);
        if (commit_hooks.waiting)
            commit_hooks.waiting(commit_hooks.arg);
        syscall(SYS_futex, &sl->wake, FUTEX_WAIT, seq, &ts, NULL, 0);
        if ((e = commit_shm_lock(shm)) != 0)
            return e;
        if (sl->waiters)
            sl->waiters--;
        if (sl->leader == leader && sl->started == round &&
            sl->done < round && !commit_pid_alive(leader)) {
            log_warning("commit: group commit leader died, round abandoned "
                        "pid=<%ld>", (long)leader);
            commit_slot_abandon(shm, sl);
        }
    }
    if (joined)
        commit_totals.rounds_joined++;
    return e;
}

/* "file": fsync every file, then every directory; shm may be NULL. */
static int commit_sync_files(struct commit_batch *b, struct commit_shm *shm)
{
    size_t i;
    int r = STORE_OK, fd, rc, e;

    for (i = 0; i < b->nfds && r == STORE_OK; i++) {
        commit_totals.file_syncs++;
        if (shm)
            COMMIT_ADD(shm->file_syncs);
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
        if (shm)
            COMMIT_ADD(shm->dir_syncs);
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
    return r;
}

/* A file system of a batch: its slot and a descriptor for syncfs(). */
struct commit_fs {
    uint64_t dev;
    int slot;
    int fd;                   /* a batch descriptor, or own (opened dir) */
    int own;
    const char *dir;          /* when no descriptor of the batch is on it */
};

#define COMMIT_FALLBACK (-1)

/*
 * "group": the rounds of every file system of the batch, then the check of
 * the batch's own files.  A store code, or COMMIT_FALLBACK when the shared
 * state cannot serve this batch (nothing synced yet; warned).
 */
static int commit_sync_group(struct commit_batch *b, struct commit_shm *shm)
{
    struct commit_fs fs[COMMIT_SHM_SLOTS];
    struct stat st;
    size_t i, nfs = 0, k;
    int r = STORE_OK, e, rc;
    const char *what;

    /* the file systems the batch touches */
    for (i = 0; i < b->nfds + b->ndirs; i++) {
        if (i < b->nfds) {
            rc = fstat(b->fds[i], &st);
            what = "fstat";
        } else {
            rc = stat(b->dirs[i - b->nfds], &st);
            what = "stat";
        }
        if (rc < 0) {
            e = errno;
            if (i < b->nfds)
                log_error("commit: %s failed fd=<%d> error=<%s>", what,
                          b->fds[i], strerror(e));
            else
                log_error("commit: directory %s failed dir=<%s> error=<%s>",
                          what, b->dirs[i - b->nfds], strerror(e));
            return commit_error(e);
        }
        for (k = 0; k < nfs; k++)
            if (fs[k].dev == (uint64_t)st.st_dev)
                break;
        if (k == nfs) {
            if (nfs == COMMIT_SHM_SLOTS) {
                commit_fallback_warning("too many file systems in one batch",
                                        0);
                return COMMIT_FALLBACK;
            }
            fs[nfs].dev = (uint64_t)st.st_dev;
            fs[nfs].slot = -1;
            fs[nfs].fd = i < b->nfds ? b->fds[i] : -1;
            fs[nfs].own = 0;
            fs[nfs].dir = i < b->nfds ? NULL : b->dirs[i - b->nfds];
            nfs++;
        }
    }

    /* their slots */
    if ((e = commit_shm_lock(shm)) != 0) {
        commit_fallback_warning("shared lock unusable", e);
        return COMMIT_FALLBACK;
    }
    if (commit_hooks.locked)
        commit_hooks.locked(commit_hooks.arg);
    for (k = 0; k < nfs; k++) {
        fs[k].slot = commit_slot_find(shm, fs[k].dev);
        if (fs[k].slot < 0) {
            commit_shm_unlock(shm);
            commit_fallback_warning("file system table full", 0);
            return COMMIT_FALLBACK;
        }
    }
    commit_shm_unlock(shm);

    /* one round per file system */
    for (k = 0; k < nfs && r == STORE_OK; k++) {
        if (fs[k].fd < 0) {
            fs[k].fd = open(fs[k].dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
            if (fs[k].fd < 0) {
                e = errno;
                log_error("commit: directory open failed dir=<%s> error=<%s>",
                          fs[k].dir, strerror(e));
                r = commit_error(e);
                break;
            }
            fs[k].own = 1;
        }
        if ((e = commit_shm_lock(shm)) != 0) {
            log_error("commit: group commit lock failed error=<%s>",
                      strerror(e));
            r = commit_error(e);
        } else {
            e = commit_group_round(shm, fs[k].slot, fs[k].fd, 0);
            commit_shm_unlock(shm);
            if (e) {
                log_error("commit: group sync failed dev=<%llu> error=<%s>",
                          (unsigned long long)fs[k].dev, strerror(e));
                r = commit_error(e);
            }
        }
        if (fs[k].own) {
            close(fs[k].fd);
            fs[k].fd = -1;
            fs[k].own = 0;
        }
    }
    for (; k < nfs; k++)
        if (fs[k].own)
            close(fs[k].fd);

    /* the batch's own files: writeback errors since they were opened */
    for (i = 0; i < b->nfds && r == STORE_OK; i++) {
        do
            rc = sync_file_range(b->fds[i], 0, 0, SYNC_FILE_RANGE_WAIT_BEFORE);
        while (rc < 0 && errno == EINTR);
        if (rc < 0 && (errno == ESPIPE || errno == EINVAL)) {
            commit_totals.file_syncs++;     /* not a regular file */
            COMMIT_ADD(shm->file_syncs);
            do
                rc = fsync(b->fds[i]);
            while (rc < 0 && errno == EINTR);
        }
        if (rc < 0) {
            e = errno;
            log_error("commit: writeback error fd=<%d> error=<%s>", b->fds[i],
                      strerror(e));
            r = commit_error(e);
        }
    }
    return r;
}

/*
 * One commit.  The inside depends on spool_sync; the first failure ends
 * it: the batch is then not durable as a whole, and the caller cancels
 * what it covered.
 */
int commit_batch_sync(struct commit_batch *b)
{
    struct commit_shm *shm = NULL;
    int r = STORE_OK, mode, e = 0;

    if (b->nfds == 0 && b->ndirs == 0)
        return STORE_OK;
    commit_totals.rounds++;
    mode = commit_mode_of(b->conf);
    if (b->conf) {
        shm = commit_shm_get(b->conf, &e);
        if (!shm && mode == COMMIT_MODE_GROUP)
            commit_fallback_warning(e ? "shared state unusable" :
                                    "configdirectory not set", e);
    }
    if (shm)
        COMMIT_ADD(shm->commits);

    switch (mode) {
    case COMMIT_MODE_OFF:
        break;
    case COMMIT_MODE_JOURNAL:
        if (b->own_files) {
            r = commit_sync_files(b, shm);
            break;
        }
        /* FALLTHROUGH */
    case COMMIT_MODE_GROUP:
        if (shm) {
            r = commit_sync_group(b, shm);
            if (r != COMMIT_FALLBACK)
                break;
            COMMIT_ADD(shm->fallbacks);
        }
        commit_totals.fallbacks++;
        r = commit_sync_files(b, shm);
        break;
    default:
        r = commit_sync_files(b, shm);
        break;
    }

    commit_batch_empty(b);
    return r;
}

void commit_stats_get(struct commit_stats *st)
{
    *st = commit_totals;
}

int commit_shared_stats(const struct imapconf *conf,
                        struct commit_shared_stats *st)
{
    char path[PATH_MAX];
    struct commit_shm_map *m;
    struct commit_shm *shm;
    int e, i;

    memset(st, 0, sizeof(*st));
    if (!conf || commit_shm_path(conf, path, sizeof(path)) < 0) {
        log_error("commit: no configdirectory for the shared counters");
        return STORE_IOERROR;
    }
    if ((m = commit_map_find(path)) != NULL) {
        shm = m->shm;
    } else {
        e = commit_shm_open(path, 0, &shm);
        if (e == ENOENT)
            return STORE_NOTFOUND;
        if (e == EBADMSG) {
            log_error("commit: shared state damaged file=<%s>", path);
            return STORE_CORRUPT;
        }
        if (e) {
            log_error("commit: shared state unusable file=<%s> error=<%s>",
                      path, strerror(e));
            return STORE_IOERROR;
        }
        if (!(shm = commit_map_add(path, shm)))
            return STORE_NOMEM;
    }
    st->commits = COMMIT_LOAD(shm->commits);
    st->syncfs_calls = COMMIT_LOAD(shm->syncfs_calls);
    st->file_syncs = COMMIT_LOAD(shm->file_syncs);
    st->dir_syncs = COMMIT_LOAD(shm->dir_syncs);
    st->rounds_failed = COMMIT_LOAD(shm->rounds_failed);
    st->rounds_abandoned = COMMIT_LOAD(shm->rounds_abandoned);
    st->repairs = COMMIT_LOAD(shm->repairs);
    st->fallbacks = COMMIT_LOAD(shm->fallbacks);
    st->journal_syncs = COMMIT_LOAD(shm->journal_syncs);
    st->journal_records = COMMIT_LOAD(shm->journal_records);
    st->checkpoints = COMMIT_LOAD(shm->checkpoints);
    for (i = 0; i < COMMIT_SHM_SLOTS; i++) {
        st->rounds_started += COMMIT_LOAD(shm->slots[i].started);
        st->rounds_done += COMMIT_LOAD(shm->slots[i].done);
    }
    return STORE_OK;
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

/* ---- the journal's shared state (journal.c) ---------------------------- */

struct commit_shm *commit_journal_shm(const struct imapconf *conf)
{
    int e;

    return conf ? commit_shm_get(conf, &e) : NULL;
}

int commit_journal_lock(const struct imapconf *conf, uint64_t dev,
                        uint64_t ino, struct commit_journal_state **js_r)
{
    struct commit_shm *shm;
    int e;

    *js_r = NULL;
    if (!conf || !(shm = commit_shm_get(conf, &e)))
        return e ? e : ENOENT;
    return commit_journal_lock_shm(shm, dev, ino, js_r);
}

int commit_journal_lock_shm(struct commit_shm *shm, uint64_t dev,
                            uint64_t ino, struct commit_journal_state **js_r)
{
    struct commit_journal_state *js;
    int e, i, freei = -1;

    *js_r = NULL;
    if ((e = commit_shm_lock(shm)) != 0)
        return e;
    for (i = 0; i < COMMIT_JOURNAL_SLOTS; i++) {
        js = &shm->journals[i];
        if (js->used && js->dev == dev && js->ino == ino) {
            *js_r = js;
            return 0;
        }
        if (!js->used && freei < 0)
            freei = i;
    }
    if (freei < 0) {
        commit_shm_unlock(shm);
        return ENOSPC;
    }
    js = &shm->journals[freei];
    memset(js, 0, sizeof(*js));
    js->dev = dev;
    js->ino = ino;
    js->used = 1;
    *js_r = js;
    return 0;
}

void commit_journal_unlock(const struct imapconf *conf)
{
    struct commit_shm *shm;
    int e;

    if ((shm = commit_shm_get(conf, &e)) != NULL)
        commit_shm_unlock(shm);
}

void commit_journal_unlock_shm(struct commit_shm *shm)
{
    commit_shm_unlock(shm);
}

void commit_journal_count(const struct imapconf *conf, int checkpoint)
{
    struct commit_shm *shm;
    int e;

    if ((shm = commit_shm_get(conf, &e)) == NULL)
        return;
    commit_journal_count_shm(shm, checkpoint);
}

void commit_journal_count_shm(struct commit_shm *shm, int checkpoint)
{
    if (checkpoint)
        COMMIT_ADD(shm->checkpoints);
    else
        COMMIT_ADD(shm->journal_records);
}

int commit_journal_round(const struct imapconf *conf, uint64_t dev,
                         uint64_t ino, int fd)
{
    struct commit_shm *shm;
    int e;

    if (!conf || !(shm = commit_shm_get(conf, &e)))
        return e ? e : ENOENT;
    if ((e = commit_shm_lock(shm)) != 0)
        return e;
    return commit_journal_round_held(conf, dev, ino, fd);
}

int commit_journal_round_held(const struct imapconf *conf, uint64_t dev,
                              uint64_t ino, int fd)
{
    struct commit_shm *shm;
    int e, si;

    if (!conf || !(shm = commit_shm_get(conf, &e)))
        return e ? e : ENOENT;   /* cannot happen: the mutex is in it */
    si = commit_slot_find(shm, COMMIT_JOURNAL_KEY(dev, ino));
    if (si < 0) {
        commit_shm_unlock(shm);
        return ENOSPC;
    }
    e = commit_group_round(shm, si, fd, 1);
    commit_shm_unlock(shm);
    return e;
}
