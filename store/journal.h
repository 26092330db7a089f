/*
 * journal.h - the per-partition delivery journal (spool_sync: journal).
 *
 * With spool_sync: journal an append is made durable by ONE redo record
 * in the journal of the stage's partition, PARTITION/journal./journal,
 * instead of syncing the message file, its directory entries and the
 * indexes: the record holds the message bytes and, for every mailbox the
 * message was reserved in, what the index record says (uid, uidvalidity,
 * size, header size, SHA-1, internal date, flags, keywords).  Records are
 * written with pwrite() at offsets handed out through the shared state
 * (CONFIGDIR/commit.shm) and made durable by a group fdatasync() round on
 * the journal file: one fdatasync() for every record written before the
 * round began, in every process.  What the record covers is written back
 * by the kernel in its own time; a checkpoint (one syncfs() of the
 * partition's file system) makes it durable in place before a segment of
 * the journal is reused.  After a power loss, journal_replay() (run by
 * ctl_cyrusdb -r in the master's START, and by mbtool journal-replay)
 * puts back whatever the records say and the disk lost.  The format, the
 * protocol and the crash argument are at the top of journal.c.
 *
 * Each function returns a store code (store.h).
 */
#ifndef STORE_JOURNAL_H
#define STORE_JOURNAL_H

#include <stddef.h>
#include <stdint.h>

#include "lib/imapconf.h"
#include "store/mailbox.h"

#define JOURNAL_DIR "journal."
#define JOURNAL_FNAME "journal"

/* One reservation a record covers (the message bytes are the record's). */
struct journal_entry {
    const char *mailbox;        /* internal name */
    const char *partition;      /* the mailbox's partition */
    uint32_t uid;
    uint32_t uidvalidity;
    uint32_t compactions;       /* the index's at reservation (a record
                                   missing after a later compaction was
                                   expunged, not lost) */
    uint32_t sysflags;          /* MAILBOX_SYSTEM_FLAGS bits */
    int64_t internaldate;
    struct mailbox_msginfo info;
    const char *const *keywords;
    size_t nkeywords;
};

/* 1 when conf's spool_sync is "journal". */
int journal_mode(const struct imapconf *conf);

/*
 * Write one record for the message (msgsize bytes: msg, or when msg is
 * NULL read with pread from offset 0 of msgfd) and the n reservations of
 * entries into the journal
 * of `partition`, and return when it is durable (a group fdatasync round
 * that began after the record was written succeeded).  msg must be the
 * bytes whose SHA-1 is every entry's digest (as the stage computed it
 * while they passed): the record's CRC then leaves them out and replay
 * checks them by that digest, so they are neither read back nor
 * checksummed again.  Every mailbox of
 * the entries must be on the journal's file system (the checkpoint syncs
 * that one file system).
 * STORE_OK: durable; the caller may finish and acknowledge.
 * STORE_NOTIMPLEMENTED: the journal cannot take this record (too big for
 *     a segment, a mailbox on another file system, the journal not yet
 *     replayed since a crash, or given up after an I/O error, or the
 *     shared state unusable); nothing was made durable, the caller syncs
 *     the "group" way instead.  Logged once per process and reason.
 * STORE_IOERROR / STORE_NOSPACE: the round failed; the caller cancels the
 *     reservations and answers 4xx.  The journal is then given up (every
 *     process falls back to group commit) until journal_replay() runs.
 */
int journal_commit(const struct imapconf *conf, const char *partition,
                   int msgfd, const void *msg, uint32_t msgsize,
                   const struct journal_entry *entries, size_t n);

/* What journal_replay() did. */
struct journal_replay_stats {
    unsigned long records;      /* valid records since the checkpoint */
    unsigned long entries;      /* reservations in them */
    unsigned long files_written; /* DIR/UID. rewritten from the journal */
    unsigned long records_added; /* index records put back */
    unsigned long reconstructs; /* indexes rebuilt (damaged by the loss) */
    unsigned long skipped;      /* mailbox gone or recreated, uid
                                   expunged, aborted, or another message */
    unsigned long failed;       /* entries that could not be restored */
};

/*
 * Redo every valid record of the journal of `partition` (NULL =
 * defaultpartition) written since its last checkpoint: the records are
 * read in order until the first torn or stale one; for each reservation
 * the mailbox (same uidvalidity) must hold that uid with that digest:
 * DIR/UID. is rewritten from the record's bytes when missing or different,
 * the index record added when missing (in uid order; uidnext raised) or
 * left to the mailbox's own recovery when pending; then one syncfs() and
 * the checkpoint mark make all of it durable, and the shared state is
 * reset so the next delivery starts a new segment.  Idempotent.  Must run
 * while no delivery uses the journal (the master's START).  No journal
 * file: STORE_OK with zero stats.  STORE_OK (each entry that could not be
 * restored is logged and counted in failed), STORE_BADPARTITION,
 * STORE_IOERROR, STORE_NOMEM.  st may be NULL.
 */
int journal_replay(const struct imapconf *conf, const char *partition,
                   struct journal_replay_stats *st);

/* journal_replay() of every partition-NAME of conf; the first error is
 * returned after all were tried; st sums them (may be NULL). */
int journal_replay_all(const struct imapconf *conf,
                       struct journal_replay_stats *st);

/* ---- for tests ---- */

/* Wait until every checkpoint this process runs in the background (a
 * thread started by the journal_commit() that switched segments) is done.
 * exit() does it too. */
void journal_checkpoints_wait(void);

/* Force the next journal_commit() of this process to fail its round with
 * errno e (0 clears), as if fdatasync() had returned it. */
void journal_test_fail_sync(int e);

/* fd >= 0: every checkpoint of this process reads one byte from fd
 * before its syncfs() (held until the test writes it); -1 clears. */
void journal_test_hold_checkpoint(int fd);

/* on != 0: the next journal_commit() of this process kills the process
 * (SIGKILL) after its record is reserved, before the record is written,
 * as a writer killed there. */
void journal_test_die_reserved(int on);

#endif
