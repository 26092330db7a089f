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
 * How a round is made is chosen by imapd.conf's spool_sync (read from the
 * batch's configuration; a NULL configuration means "file"):
 *
 *   group (the default)  group commit across processes: the committers
 *       waiting at the same moment on the same file system share ONE
 *       syncfs() issued by one of them (the leader), coordinated through
 *       CONFIGDIR/commit.shm; see commit.c for the protocol and the
 *       durability argument.  When the shared state cannot be used (no
 *       configdirectory, no permission, no free file-system slot) the
 *       commit is made the "file" way, with one warning per process.
 *   file  fsync() of each file (data and inode: the link count of a
 *       hard-linked message), then fsync() of each directory, each object
 *       once, in the order added.
 *   journal  an append is made durable by one record in its partition's
 *       delivery journal and a group fdatasync() round on it (journal.h);
 *       everything else as "group".
 *   off   NO SYNC AT ALL.  UNSAFE: a crash of the machine or a power loss
 *       can lose mail that was acknowledged (a killed process loses
 *       nothing: the data is in the page cache).  For measurement (the
 *       ceiling a no-sync spool gives) and for administrators who choose
 *       it knowingly.  The counters still count commits.
 */
#ifndef STORE_COMMIT_H
#define STORE_COMMIT_H

#include <stdint.h>

#include "lib/imapconf.h"

struct commit_batch;

/* STORE_OK or STORE_NOMEM.  conf is borrowed (kept until the batch is
 * freed) and may be NULL: then spool_sync is "file". */
int commit_batch_new(const struct imapconf *conf, struct commit_batch **b_r);

/* With spool_sync: journal, sync this batch's own files and directories
 * as "file" does instead of a shared syncfs() round: for small commits
 * (an index after a flag change) while the file system holds many dirty
 * pages that the journal leaves to writeback on purpose.  Other modes
 * are unaffected. */
void commit_batch_own_files(struct commit_batch *b);

/* Add an open file.  The fd is borrowed: the caller keeps it open until
 * commit_batch_sync() has returned (closing it early could drop the
 * caller's fcntl locks on that file and is a bug).  The same fd twice is
 * kept once.  STORE_OK, STORE_NOMEM, STORE_INTERNAL (fd < 0). */
int commit_batch_add_fd(struct commit_batch *b, int fd);

/* Add a directory whose entries changed (created, linked, renamed,
 * unlinked); the path is copied, duplicates (same string) kept once.
 * STORE_OK, STORE_NOMEM, STORE_INTERNAL (NULL or empty path). */
int commit_batch_add_dir(struct commit_batch *b, const char *dir);

/* Make everything added durable (as spool_sync says).  STORE_OK; STORE_NOSPACE or
 * STORE_IOERROR when a sync failed (then nothing of the batch may be
 * treated as durable, and the caller must not acknowledge).  The batch is
 * emptied either way and can be reused.  An empty batch is STORE_OK
 * without a round (no counter moves).  The first failing sync ends the
 * round (logged with fd=<> or dir=<> and error=<>); ENOSPC and EDQUOT give
 * STORE_NOSPACE, every other errno STORE_IOERROR.  Not thread-safe: one
 * batch per thread, and the counters assume one thread per process.
 * With spool_sync: group the call may wait for a round led by another
 * process (bounded by that round's syncfs(); a leader that dies is
 * replaced within about 50 ms); a failed round (syncfs() or the
 * check of the batch's own files reporting EIO, ENOSPC, ...) fails every
 * commit that depended on it, with the same codes.  A descriptor that
 * cannot be fstat()ed or a directory that cannot be stat()ed is logged and
 * gives STORE_IOERROR (STORE_NOSPACE for ENOSPC/EDQUOT) as in "file". */
int commit_batch_sync(struct commit_batch *b);

/* Counters of this process since start, for benchmarks and tests (a
 * fork()ed child starts from its parent's values: take differences). */
struct commit_stats {
    unsigned long rounds;       /* commit_batch_sync calls with a non-empty
                                   batch, in every mode (with "off" they
                                   synced nothing) */
    unsigned long file_syncs;   /* fsync/fdatasync calls on files */
    unsigned long dir_syncs;    /* fsync calls on directories */
    unsigned long rounds_led;   /* group rounds this process led: its
                                   syncfs() calls */
    unsigned long rounds_joined; /* group rounds another process led that
                                   this process waited for */
    unsigned long fallbacks;    /* group commits made the "file" way */
};
void commit_stats_get(struct commit_stats *st);

void commit_batch_free(struct commit_batch **bp);

/* ---- the shared state of group commit -----------------------------------
 *
 * CONFIGDIR/commit.shm (mode 0600, created on demand by the first commit of
 * any mode with a configuration, mapped once per process and kept):
 * counters over every process that uses this configdirectory, and the
 * group commit rounds per file system.  Its layout is private to commit.c
 * and valid for one boot; a file from an earlier boot, of another layout,
 * or damaged is replaced (a new file renamed over it, logged) by the next
 * commit, never used.  Removing it while processes run is harmless for
 * correctness (those keep their mapping; newcomers coordinate through the
 * new file) but splits the counters.
 */
struct commit_shared_stats {
    unsigned long long commits;     /* commit_batch_sync calls with a
                                       non-empty batch, every mode */
    unsigned long long syncfs_calls; /* group rounds that called syncfs() */
    unsigned long long file_syncs;  /* fsync calls on files ("file" mode and
                                       the fallback) */
    unsigned long long dir_syncs;   /* fsync calls on directories */
    unsigned long long rounds_started; /* group rounds started, all file
                                       systems together */
    unsigned long long rounds_done; /* group rounds finished or abandoned */
    unsigned long long rounds_failed; /* rounds whose syncfs() failed */
    unsigned long long rounds_abandoned; /* rounds whose leader died */
    unsigned long long repairs;     /* lock owners found dead (EOWNERDEAD) */
    unsigned long long fallbacks;   /* group commits made the "file" way */
    unsigned long long journal_syncs; /* journal rounds (fdatasync calls) */
    unsigned long long journal_records; /* records written to journals */
    unsigned long long checkpoints; /* journal checkpoints (syncfs calls) */
};

/* Read the shared counters of conf's configdirectory into *st (a snapshot:
 * each counter is read atomically, not all of them at one instant).
 * Never creates the file.  STORE_OK; STORE_NOTFOUND when commit.shm does
 * not exist (no commit yet) or is from an earlier boot; STORE_CORRUPT when
 * it is damaged or of another layout; STORE_IOERROR when configdirectory
 * is not set or the file cannot be opened or mapped (logged). */
int commit_shared_stats(const struct imapconf *conf,
                        struct commit_shared_stats *st);

/* ---- the shared state of the delivery journal (journal.c only) ---------
 *
 * One entry per journal file (dev, ino) in commit.shm.  Every field is
 * read and changed only between commit_journal_lock() and
 * commit_journal_unlock() (the one shared mutex of commit.shm).  The
 * meaning of the fields is journal.c's (see the top of journal.c). */
#define COMMIT_JOURNAL_INFLIGHT 64   /* records reserved, not yet written */

struct commit_journal_state {
    uint64_t dev, ino;        /* the journal file */
    uint32_t used;            /* 1 once claimed */
    uint32_t state;           /* journal.c's JNL_STATE_* */
    int32_t ckpt_pid;         /* a checkpoint in progress, 0 = none */
    uint32_t active;          /* the segment written, 0 or 1 */
    uint64_t gen[2];          /* each segment's generation */
    uint32_t full[2];         /* 1: holds records not yet checkpointed */
    uint64_t off;             /* next free byte in the active segment */
    uint64_t seq;             /* the next record's sequence number */
    uint64_t segsize;         /* bytes per segment */
    uint64_t filled;          /* zeros written and synced up to here */
    uint64_t written;         /* every record up to this sequence has its
                               * pwrite() finished (or a filler instead) */
    uint32_t wake;            /* futex word: bumped when written advances */
    uint32_t waiters;         /* processes waiting on wake (a killed one
                               * stays counted: harmless, a wake too many) */
    struct commit_journal_write {   /* a reserved record, by seq % size */
        uint64_t seq, off, gen;
        uint32_t len;
        int32_t pid;          /* its writer */
        uint32_t state;       /* journal.c's JNL_W_* */
        uint32_t pad;
    } inflight[COMMIT_JOURNAL_INFLIGHT];
};

/* Find or claim the entry of journal (dev, ino) and return with the shared
 * mutex held (0 and *js_r), or an errno (ENOSPC: table full; the mutex is
 * not held then). */
int commit_journal_lock(const struct imapconf *conf, uint64_t dev,
                        uint64_t ino, struct commit_journal_state **js_r);
void commit_journal_unlock(const struct imapconf *conf);
/* One group round on journal (dev, ino): returns when an fdatasync(fd)
 * that began after the call succeeded (0), or with the errno of the
 * round's failure; leader death and lock-owner death as for syncfs()
 * rounds.  Called without the mutex. */
int commit_journal_round(const struct imapconf *conf, uint64_t dev,
                         uint64_t ino, int fd);
/* The same, called with the mutex held (commit_journal_lock(), which the
 * journal's own bookkeeping took just before: one lock round per delivery
 * less); returns without it. */
int commit_journal_round_held(const struct imapconf *conf, uint64_t dev,
                              uint64_t ino, int fd);
/* Count a record (checkpoint = 0) or a checkpoint (1). */
void commit_journal_count(const struct imapconf *conf, int checkpoint);
/* The same three through the mapping itself, for a thread that must not
 * use conf (the journal's background checkpoint): commit_journal_shm()
 * returns conf's mapping (NULL when unusable); it stays mapped for the
 * life of the process. */
struct commit_shm;
struct commit_shm *commit_journal_shm(const struct imapconf *conf);
int commit_journal_lock_shm(struct commit_shm *shm, uint64_t dev,
                            uint64_t ino, struct commit_journal_state **js_r);
void commit_journal_unlock_shm(struct commit_shm *shm);
void commit_journal_count_shm(struct commit_shm *shm, int checkpoint);

/* ---- test hooks (for tests/store/test_commit.c only) --------------------
 * Per process; NULL clears.  before_syncfs: called by a group leader after
 * its round is marked started and the lock released, just before syncfs();
 * returning an errno value makes the round fail with it (syncfs() is then
 * not called), 0 goes on.  locked: called once per commit with the shared
 * lock held, at the committer's arrival (a process killed there leaves the
 * robust mutex to the next locker as EOWNERDEAD).  waiting: called with
 * the lock released each time a committer goes to sleep on a round that
 * another process leads (it has then chosen the round it needs), so a
 * test can wait for that event instead of sleeping.  The struct is
 * copied. */
struct commit_test_hooks {
    int (*before_syncfs)(void *arg);
    void (*locked)(void *arg);
    void (*waiting)(void *arg);
    void *arg;
};
void commit_test_set_hooks(const struct commit_test_hooks *h);

#endif
