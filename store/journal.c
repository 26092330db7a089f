/*
 * journal.c - the per-partition delivery journal (journal.h).
 *
 * WHY
 *
 * A durable append in "group" mode costs one syncfs() of the partition's
 * file system per round: it writes back every dirty page of every file
 * (message files, indexes), and commits the file system's journal with
 * the directory entries and inodes of all of them.  In "journal" mode a
 * round is one fdatasync() of ONE preallocated file that is overwritten
 * in place (no block allocation, no inode change beyond the times, so on
 * ext4 and XFS the fdatasync is a data write plus a cache flush without a
 * file system journal commit).  Message files, directory entries and
 * indexes are left to the kernel's writeback, and made durable in bulk by
 * a checkpoint: one syncfs() per segment of the journal (16 MiB by
 * default: about 1,100 messages of 14 KB) instead of one per round.
 *
 * ON-DISK FORMAT (PARTITION/journal./journal; all integers little-endian)
 *
 *   [0, 4096)        file header: 0 magic "CDJNL001"  8 version u32 (2;
 *                    1 is read, and rewritten as 2 before a record is
 *                    written, so that a binary that knows only version 1
 *                    refuses the file instead of misreading field 36)
 *                    12 zero  16 segment size u64  24 checkpoint
 *                    generation u64  32 CRC-32C of [0, 32).
 *   segment i (0, 1) at 4096 + i * segsize, segsize bytes:
 *     [0, 4096)      segment header: 0 magic "CDJSEG01"  8 generation u64
 *                    16 first sequence u64  24 CRC-32C of [0, 24).
 *     [4096, ...)    records, back to back, each a multiple of 16 bytes:
 *       0 magic u32 0x524a4443 ("CDJR")  4 length u32 (whole record,
 *       padded)  8 generation u64 (the segment's)  16 sequence u64
 *       24 entries u32  28 message size u32  32 CRC-32C u32 of the
 *       record with this field zero  36 message offset u32: 0 = the CRC
 *       covers the whole record; else the offset of the message bytes,
 *       which the CRC leaves out and the SHA-1 digest of the entries
 *       (every entry has the same one, the entries end at that offset)
 *       covers: the message is then checksummed once, by the SHA-1 the
 *       stage computes anyway (journal_commit with the bytes in memory)
 *       40 the entries, each: uid u32, uidvalidity u32, compactions u32,
 *       sysflags u32, internaldate i64, size u32, header size u32,
 *       SHA-1 (20), mailbox name length u16, partition length u16,
 *       keyword count u16, the names (no NUL), each keyword as length
 *       u16 + bytes;
 *       then the message bytes; then zeros up to the length.
 *   The file is created with its header only (a temporary file fsynced
 *   and linked into place); before a record or segment header is written
 *   beyond what was ever written, zeros are written and fdatasync()ed up
 *   to the next MiB (jnl_fill, under the mutex), so that every record
 *   write is an overwrite of allocated, written blocks and its round's
 *   fdatasync() needs no metadata commit.  The file reaches 4 KiB + 2 x
 *   segment size on the first pass and stays so; bytes beyond its end
 *   read as zeros (no record).
 *
 *   Records with generation <= the checkpoint generation are durable in
 *   place and never replayed.  A segment's valid records are the run that
 *   starts at its offset 4096 with sequence `first sequence`, each with the
 *   segment's generation, the next sequence number, a length inside the
 *   segment, a good CRC and, when field 36 is set, the message's SHA-1
 *   equal to the entries' digest; the run ends at the first record that is
 *   not (zeros, a torn write, a record of an older generation).
 *
 * WRITING (journal_commit)
 *
 * The shared state (struct commit_journal_state in CONFIGDIR/commit.shm,
 * under commit.shm's robust mutex) holds the active segment, the offset
 * of its next free byte, the next sequence, each segment's generation,
 * whether the other segment still needs a checkpoint, the written mark
 * and a ring of the records reserved but not yet written (inflight[seq %
 * 64]: sequence, offset, length, generation, writer pid, WRITING/DONE).
 * A committer builds the head of its record (header and entries) in
 * memory; the message bytes are the stage's own buffer when the whole
 * message is still in it (up to 64 KiB: no read back, no CRC of them,
 * field 36), else they are read back from the staged file; then under the
 * mutex it RESERVES: offset and sequence taken and advanced,
 * its ring entry set WRITING; it releases the mutex, puts generation,
 * sequence and CRC into the record and pwritev()s it there (head,
 * message, padding), so the writes
 * of many committers overlap.  Then, under the mutex, its entry becomes
 * DONE and `written` advances over every DONE entry in sequence order
 * (a futex word wakes the waiters): `written` = s means every record
 * with a sequence <= s has its bytes in the page cache.  The committer
 * waits until `written` >= its own sequence, and only then joins a group
 * round on the journal file (commit.c's leader/follower protocol with
 * fdatasync() instead of syncfs()): it returns when a round that began
 * after that moment succeeded.  When marking its own entry DONE brings
 * `written` to its sequence (the common case), it joins the round in that
 * same hold of the mutex (commit_journal_round_held: the round's target
 * is taken there, after `written` reached it); else it waits on the futex
 * word, counted in `waiters` from its look at the word to the end of its
 * wait, and jnl_written() makes the FUTEX_WAKE call only when `waiters`
 * is not 0 (liveness only: a killed waiter stays counted, a wake too
 * many; the 50 ms wait step bounds a wake missed any other way).  A waiter that finds the oldest WRITING
 * entry's writer dead (killed inside its pwrite, or before it) writes a
 * FILLER in its place: a valid record of the same length, generation and
 * sequence with no entries and no message (replay skips it), then marks
 * it DONE.  A reservation waits when 64 records are in flight, and a
 * segment switch waits until every record reserved before it is written.
 *
 * When the record does not fit in the active segment, the writer switches
 * to the other segment, which must be checkpointed: it gets generation
 * max + 1 and its header is written (before any record in it, so the
 * round that makes a record durable makes the header durable too).  The
 * segment left is then "full" and its checkpoint is started by the writer
 * that switched, after its own round, in a thread of its process (see
 * "the checkpoint in the background" below; inline when no thread can be
 * started), so that neither its delivery nor the next one of its process
 * waits for it: syncfs() of the journal's file system, then the file
 * header with checkpoint generation = that segment's generation,
 * fdatasync(); then, under the mutex, the segment is no longer "full".  A
 * writer that needs a full segment whose checkpoint is running waits for
 * it (polling, a dead checkpointer's process is replaced: it runs the
 * checkpoint itself, as it must wait anyway).  With ~1,100 messages per
 * segment the background checkpoint is long done before the active
 * segment fills.
 *
 * THE CRASH ARGUMENT (in addition to the one at the top of commit.c)
 *
 * Claim: when journal_commit() returned STORE_OK for a delivery, after a
 * power loss (any subset of unsynced writes lost) and journal_replay(),
 * every mailbox of the delivery holds its uid with those bytes, that
 * digest and those flags, committed; a message never acknowledged is
 * absent or complete, as before.
 *
 *  1. The record is on disk, and so is every record before it in its
 *     segment.  Offsets and sequences are handed out together, in order,
 *     under the mutex, so the records of a segment lie in sequence order
 *     from offset 4096 on, back to back.  The committer joined its round
 *     only after `written` reached its sequence, i.e. after the pwrite of
 *     its own record and of every earlier one (or of the filler in place
 *     of a dead writer's) had completed (when it joins in the same hold of
 *     the mutex that saw `written` reach it, the round's target is still
 *     taken after that moment: only rounds begun later count); the
 *     round's fdatasync() began after that and returned 0, so all of those bytes and the segment
 *     header (written before the first record of the segment was
 *     reserved) are durable.  A record whose pwrite failed sets the
 *     journal BROKEN before its entry is marked DONE, and a committer
 *     that finds the journal not READY after its wait commits the group
 *     way instead (syncfs: durable in place, its record is not needed),
 *     so no record is acknowledged through the journal behind a hole.
 *  2. The record is replayed unless its generation was checkpointed.
 *     Replay reads the run of valid records of each segment newer than
 *     the checkpoint.  Every record before ours in its segment is durable
 *     by 1 and valid (a filler is valid), and ours is, so the run reaches
 *     ours.  (Valid: a good CRC and, when the message is left to the
 *     entries' digest, its SHA-1.  That digest is the stage's SHA-1 of
 *     exactly the bytes written, computed as they came in: the bytes are
 *     the same buffer, never re-read.  A durable record passes both; a
 *     torn one, whose bytes mix old and new sectors, fails the CRC where
 *     the head or padding is torn and the SHA-1 where the message is.)
 *     Records after ours may be lost, torn or missing while later
 *     ones are whole (they were written out of order): the first of them
 *     ends the run, and none of them was acknowledged (a round
 *     acknowledging one began after everything before it, the gap
 *     included, was written).
 *  3. A checkpointed record is durable in place.  Everything an append
 *     writes in place (staging data = the message file's inode, the link
 *     DIR/UID., the PENDING record and header: R in commit.c) was written
 *     before the record was reserved, which is before the segment left
 *     the active state, which is before the checkpoint's syncfs() began
 *     (the thread is started after the switch; it does not matter which
 *     process or thread calls syncfs(): it writes back and commits every
 *     dirty page and inode of the file system, whoever dirtied them);
 *     that syncfs() writes back and commits all of it.  The segment is
 *     marked free only after the file header's fdatasync() returned, by
 *     the thread under the mutex; a process that dies with its thread
 *     mid-checkpoint leaves the segment "full" and ckpt_pid dead, and the
 *     next writer that needs the segment runs the whole checkpoint again
 *     (syncfs() and the mark are idempotent).  No pwrite into a
 *     segment is still running when it is checkpointed or reused: the
 *     switch away from it waited until every record reserved in it was
 *     written.  What the append writes
 *     after the round (F: PENDING cleared, visible advanced) need not be
 *     durable: a PENDING record whose file verifies is committed by the
 *     mailbox's own recovery (mailbox.c (b), (c)) at the next exclusive
 *     lock.  For that, `synced` must not claim more than is durable: in
 *     journal mode F raises it only right after an fdatasync() of the
 *     index that it makes once 128 records lie past it (mailbox.c; the
 *     resolved prefix is then durable in place, as intact records); group
 *     rounds of flag changes and cleanup raise it too, as they sync the
 *     index.
 *     A segment is overwritten only after its checkpoint's file header
 *     (generation >= the segment's) is durable, so a record is lost from
 *     the journal only once it is durable in place.
 *  4. Replay restores what the disk lost, whatever subset that is: the
 *     message file is rewritten from the record's bytes when missing or
 *     different (size and digest: a file of that name may be torn at a
 *     sector boundary or empty), BEFORE the mailbox is locked exclusively
 *     (whose recovery would otherwise abort a PENDING record whose file
 *     was lost); the exclusive lock's recovery then commits a record still
 *     PENDING; an index record that was lost (the index file shorter than
 *     before) is added back with uid, flags and keywords from the record,
 *     uidnext raised past it; an index damaged by lost pages in its middle
 *     (recovery says STORE_CORRUPT) is rebuilt from the message files,
 *     which replay has just made complete.  Then one syncfs() and the
 *     checkpoint mark.  Replay is idempotent: a crash during it is handled
 *     by running it again.
 *     The journal is the authority for the uids it covers: an entry is
 *     "ours" unless the index says otherwise through an INTACT record
 *     (another message under the uid, expunged, aborted) or a header whose
 *     compactions moved past the entry's while the uid has no record
 *     (expunged and cleaned up: cleanup syncs the index, so its records
 *     are intact).  Nothing unsynced can say otherwise: in journal mode no
 *     index write after the last checkpoint or group round is durable, so
 *     the index replay finds may hold any mix of old and new sectors.
 *     Three cases the power-loss simulator found, each handled so:
 *   a. The index lost the sectors of visible records (the header with
 *      visible advanced reached the disk, the records did not).  Looking
 *      up a uid by binary search meets a damaged record and fails; the
 *      lookup then scans every intact record (jnl_find), so a damaged
 *      record neither hides an intact one nor makes replay skip the
 *      file.  Recovery refuses such an index (STORE_CORRUPT).
 *   b. The rebuild of such an index must not take every file of the
 *      directory: a delivery that was never acknowledged leaves its file
 *      torn or empty (its staging data were never synced) and its index
 *      record maybe lost.  mailbox_reconstruct_verified() takes a file
 *      only when its size and digest are those of the old index's intact
 *      record for the uid or of an entry of ours; any other file is a
 *      never-acknowledged write (an acknowledged message has a durable
 *      record, by a checkpoint or a group round, or a journal entry) and
 *      is unlinked.
 *   c. The recovery of the exclusive lock cuts a torn tail of records and
 *      unlinks the files of the uids it lost (stale reservations, as far
 *      as the index knows), including a file replay has just restored;
 *      the uid is then below uidnext without a record and only a rebuild
 *      can put it back.  Before every rebuild the files of our entries
 *      are written again (jnl_rebuild), and after it the compactions say
 *      nothing (reconstruct moved them): "expunged and cleaned up" is
 *      decided before the rebuild.
 *   d. The recovery makes a damaged record before intact ones an ABORTED
 *      placeholder with the next free uid (mailbox.c, mbx_fill_gaps) and
 *      unlinks that uid's file: when the damaged record was ours the
 *      placeholder sits on our uid.  A placeholder (no size, no digest)
 *      on an entry of ours is rebuilt like c, so the message keeps its
 *      uid.  An entry whose uid holds a real other message is restored
 *      under a new uid only after every other entry has its own, so that
 *      the new uid is never one a later entry needs.
 *  5. What replay must not undo: a uid the mailbox no longer has because
 *     it was expunged and cleaned up (cleanup compacts the index and
 *     syncs it, so compactions moved: recorded in the entry and compared),
 *     an ABORTED record (a failed round: never acknowledged), a mailbox
 *     deleted (not found) or recreated (other uidvalidity), and the file of
 *     a uid that holds another message: that happens when the loss took
 *     the index's uidnext and a delivery made before the replay (the
 *     group way, see "Start of a boot") got the uid again; the other
 *     message stays and the record's message is appended under a new uid
 *     (acknowledged mail is never dropped; a replay interrupted and run
 *     again may make it twice).
 *  6. A killed process (no power loss) loses nothing from the page cache;
 *     its PENDING records are decided by the mailbox recovery as before,
 *     and journal replay after it finds everything in place.  The two do
 *     not fight: replay writes files only where they are missing or
 *     different, and lets the mailbox recovery commit.
 *
 * Errors.  A failed round fails every member (STORE_IOERROR or
 * STORE_NOSPACE; the caller cancels its reservations) and marks the
 * journal BROKEN in the shared state: after an fdatasync() error the
 * kernel may have dropped the dirty pages of the file, and a later
 * successful fdatasync() says nothing about them, so the file cannot be
 * trusted for new records.  Every process then commits the "group" way
 * until journal_replay() resets the state (the next start of the master).
 * A failed checkpoint syncfs() marks it BROKEN too, and leaves the
 * segment unfreed: its records stay replayable.
 *
 * Start of a boot.  The shared state is per boot.  The first committer of
 * a boot finds the journal NEW: if a segment holds a generation beyond the
 * checkpoint, records may wait for replay, and the journal is not used
 * (NEEDS_REPLAY; commits go the group way, logged) until journal_replay()
 * has run; else it starts a new generation.  journal_replay() marks the
 * state REPLAYING while it runs and NEW after its checkpoint.
 *
 * Limits: a record must fit in a segment (else the group way); the
 * mailboxes of a record must be on the journal's partition (append.c
 * checks; a partition is one file system).  In journal mode the mailbox
 * recovery re-reads records from `synced` on: fewer than 128 plus those
 * of pending appends (see 3).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <linux/futex.h>
#include <time.h>
#include <unistd.h>

#define OPENSSL_SUPPRESS_DEPRECATED 1
#include <openssl/sha.h>

#include "lib/buf.h"
#include "lib/crc32c.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "lib/procid.h"
#include "store/commit.h"
#include "store/journal.h"
#include "store/mailbox.h"
#include "store/store.h"

#define JNL_HDR 4096
#define JNL_SEG_HDR 4096
#define JNL_FILE_MAGIC "CDJNL001"
#define JNL_SEG_MAGIC "CDJSEG01"
#define JNL_VERSION 2u
#define JNL_REC_MAGIC 0x524a4443u
#define JNL_REC_HDR 40
#define JNL_ENT_FIXED 58      /* an entry without its names and keywords */
#define JNL_ALIGN 16
#define JNL_DIR_MODE 0750
#define JNL_FILE_MODE 0600
#define JNL_ZERO_CHUNK (1024 * 1024)

/* a reserved record (commit_journal_state.inflight) */
enum {
    JNL_W_FREE = 0,
    JNL_W_WRITING = 1,        /* reserved, its pwrite() not finished */
    JNL_W_DONE = 2            /* written (or a filler in its place) */
};

#define JNL_WAIT_NS 50000000L   /* futex wait step: dead writers are
                                 * looked for this often */

enum {
    JNL_STATE_NEW = 0,        /* not yet looked at in this boot */
    JNL_STATE_READY = 1,
    JNL_STATE_BROKEN = 2,     /* an I/O error: not used until replay */
    JNL_STATE_REPLAYING = 3,
    JNL_STATE_NEEDS_REPLAY = 4
};

/* An open journal of this process. */
struct jnl_file {
    struct jnl_file *next;
    char *path;
    int fd;
    uint64_t dev, ino, segsize;
    pid_t pid;
};

static struct jnl_file *jnl_files;
static int jnl_test_errno;
static int jnl_test_die;
static int jnl_test_hold_fd = -1;
static unsigned jnl_warned;   /* reasons already logged, a bit each */
static pid_t jnl_warned_pid;

/* ---- little-endian helpers -------------------------------------------- */

static void put16(unsigned char *p, uint16_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
}

static void put32(unsigned char *p, uint32_t v)
{
    put16(p, (uint16_t)v);
    put16(p + 2, (uint16_t)(v >> 16));
}

static void put64(unsigned char *p, uint64_t v)
{
    put32(p, (uint32_t)v);
    put32(p + 4, (uint32_t)(v >> 32));
}

static uint16_t get16(const unsigned char *p)
{
    return (uint16_t)(p[0] | (p[1] << 8));
}

static uint32_t get32(const unsigned char *p)
{
    return (uint32_t)get16(p) | ((uint32_t)get16(p + 2) << 16);
}

static uint64_t get64(const unsigned char *p)
{
    return (uint64_t)get32(p) | ((uint64_t)get32(p + 4) << 32);
}

int journal_mode(const struct imapconf *conf)
{
    return conf && imapconf_getenum(conf, "spool_sync") == 3;
}

void journal_test_fail_sync(int e)
{
    jnl_test_errno = e;
}

void journal_test_die_reserved(int on)
{
    jnl_test_die = on;
}

void journal_test_hold_checkpoint(int fd)
{
    jnl_test_hold_fd = fd;
}

static int jnl_errno(int e)
{
    return (e == ENOSPC || e == EDQUOT) ? STORE_NOSPACE : STORE_IOERROR;
}

/* Log a fallback reason once per process. */
static void jnl_fallback(unsigned bit, const char *why, const char *path)
{
    if (jnl_warned_pid != getpid()) {
        jnl_warned_pid = getpid();
        jnl_warned = 0;
    }
    if (jnl_warned & bit)
        return;
    jnl_warned |= bit;
    log_warning("journal: not used, committing the group way reason=<%s> "
                "file=<%s>", why, path ? path : "");
}

/* ---- headers ------------------------------------------------------------ */

static void jnl_file_header(unsigned char *p, uint64_t segsize,
                            uint64_t ckpt_gen)
{
    memset(p, 0, JNL_HDR);
    memcpy(p, JNL_FILE_MAGIC, 8);
    put32(p + 8, JNL_VERSION);
    put64(p + 16, segsize);
    put64(p + 24, ckpt_gen);
    put32(p + 32, crc32c(p, 32));
}

/* 0 and the fields, or -1 when the header is not valid. */
static int jnl_file_header_parse(const unsigned char *p, uint64_t *segsize,
                                 uint64_t *ckpt_gen)
{
    if (memcmp(p, JNL_FILE_MAGIC, 8) != 0 ||
        get32(p + 8) < 1 || get32(p + 8) > JNL_VERSION ||
        get32(p + 32) != crc32c(p, 32))
        return -1;
    *segsize = get64(p + 16);
    *ckpt_gen = get64(p + 24);
    return 0;
}

static void jnl_seg_header(unsigned char *p, uint64_t gen, uint64_t seq)
{
    memset(p, 0, JNL_SEG_HDR);
    memcpy(p, JNL_SEG_MAGIC, 8);
    put64(p + 8, gen);
    put64(p + 16, seq);
    put32(p + 24, crc32c(p, 24));
}

static int jnl_seg_header_parse(const unsigned char *p, uint64_t *gen,
                                uint64_t *seq)
{
    if (memcmp(p, JNL_SEG_MAGIC, 8) != 0 || get32(p + 24) != crc32c(p, 24))
        return -1;
    *gen = get64(p + 8);
    *seq = get64(p + 16);
    return 0;
}

static uint32_t jnl_rec_crc(const unsigned char *rec, uint32_t len)
{
    static const unsigned char zero[4];
    uint32_t c = crc32c_update(0xFFFFFFFFu, rec, 32);

    c = crc32c_update(c, zero, 4);
    c = crc32c_update(c, rec + 36, len - 36);
    return crc32c_final(c);
}

/* The CRC of a record whose message bytes [moff, moff + msize) are
 * covered by the SHA-1 of its entries: the record without them, its CRC
 * field as zero. */
static uint32_t jnl_rec_crc_digest(const unsigned char *rec, uint32_t len,
                                   uint32_t moff, uint32_t msize)
{
    static const unsigned char zero[4];
    uint32_t c = crc32c_update(0xFFFFFFFFu, rec, 32);

    c = crc32c_update(c, zero, 4);
    c = crc32c_update(c, rec + 36, moff - 36);
    c = crc32c_update(c, rec + moff + msize, len - moff - msize);
    return crc32c_final(c);
}

/* Is the record rec of length len (magic, length, generation and sequence
 * checked) intact?  Field 36 zero: the CRC covers the whole record.  Else
 * it is the offset of the message bytes, which the CRC leaves out and the
 * SHA-1 digest of the first entry covers (the entries must end there: the
 * parse checks that, and that every entry has the same digest). */
static int jnl_rec_intact(const unsigned char *rec, uint32_t len)
{
    uint32_t moff = get32(rec + 36), msize = get32(rec + 28);
    unsigned char md[SHA_DIGEST_LENGTH];

    if (moff == 0)
        return get32(rec + 32) == jnl_rec_crc(rec, len);
    if (moff < JNL_REC_HDR + JNL_ENT_FIXED || moff > len ||
        msize > len - moff || get32(rec + 24) == 0 ||
        get32(rec + 32) != jnl_rec_crc_digest(rec, len, moff, msize))
        return 0;
    SHA1(rec + moff, msize, md);
    return memcmp(md, rec + JNL_REC_HDR + 32, SHA_DIGEST_LENGTH) == 0;
}

/* ---- the file ----------------------------------------------------------- */

static int jnl_path(const struct imapconf *conf, const char *partition,
                    struct buf *dir, struct buf *path)
{
    const char *root;

    if (!partition)
        partition = imapconf_getstring(conf, "defaultpartition");
    root = partition ? imapconf_partition(conf, partition) : NULL;
    if (!root)
        return STORE_BADPARTITION;
    buf_reset(dir);
    buf_reset(path);
    if (buf_printf(dir, "%s/%s", root, JOURNAL_DIR) != 0 ||
        buf_printf(path, "%s/%s", buf_cstring(dir), JOURNAL_FNAME) != 0)
        return STORE_NOMEM;
    return STORE_OK;
}

/* Create the journal at path, full size, zeros written, synced. */
static int jnl_create(const char *dir, const char *path, uint64_t segsize)
{
    char tmp[PATH_MAX];
    unsigned char *zero;
    int fd, e = 0, dfd;

    if (fs_mkdir_p(dir, JNL_DIR_MODE) != 0)
        return errno;
    if (snprintf(tmp, sizeof(tmp), "%s.%ld.new", path, (long)getpid()) >=
        (int)sizeof(tmp))
        return ENAMETOOLONG;
    unlink(tmp);
    fd = open(tmp, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, JNL_FILE_MODE);
    if (fd < 0)
        return errno;
    zero = calloc(1, JNL_HDR);
    if (!zero) {
        e = ENOMEM;
        goto out;
    }
    if (!e) {
        jnl_file_header(zero, segsize, 0);
        if (fs_pwrite_all(fd, zero, JNL_HDR, 0) != 0 || fsync(fd) != 0)
            e = errno;
    }
    if (!e && link(tmp, path) != 0 && errno != EEXIST)
        e = errno;      /* EEXIST: another process made it first */
    if (!e && (dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) >= 0) {
        if (fsync(dfd) != 0)
            e = errno;
        close(dfd);
    }
out:
    free(zero);
    close(fd);
    unlink(tmp);
    return e;
}

/* This process's open journal of partition (created when missing). */
static int jnl_open(const struct imapconf *conf, const char *partition,
                    struct jnl_file **jf_r)
{
    struct buf dir = BUF_INITIALIZER, path = BUF_INITIALIZER;
    unsigned char hdr[JNL_HDR];
    struct jnl_file *jf;
    struct stat st;
    uint64_t segsize, ckpt;
    long want;
    int r, fd = -1, e;

    *jf_r = NULL;
    if ((r = jnl_path(conf, partition, &dir, &path)) != STORE_OK)
        goto out;
    for (jf = jnl_files; jf; jf = jf->next)
        if (strcmp(jf->path, buf_cstring(&path)) == 0) {
            *jf_r = jf;
            goto out;
        }
    fd = open(buf_cstring(&path), O_RDWR | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT) {
        /* one creator (a lock on journal./create.lock); the others do
         * not wait for its zeros: they commit the group way meanwhile */
        struct flock fl;
        int lfd;

        if (fs_mkdir_p(buf_cstring(&dir), JNL_DIR_MODE) != 0) {
            r = jnl_errno(errno);
            goto out;
        }
        buf_printf(&dir, "/create.lock");
        lfd = open(buf_cstring(&dir), O_RDWR | O_CREAT | O_CLOEXEC,
                   JNL_FILE_MODE);
        buf_truncate(&dir, dir.len - strlen("/create.lock"));
        if (lfd < 0) {
            r = jnl_errno(errno);
            goto out;
        }
        memset(&fl, 0, sizeof(fl));
        fl.l_type = F_WRLCK;
        fl.l_whence = SEEK_SET;
        if (fcntl(lfd, F_SETLK, &fl) != 0) {
            close(lfd);
            r = STORE_BUSY;
            goto out;
        }
        fd = open(buf_cstring(&path), O_RDWR | O_CLOEXEC);
        if (fd < 0 && errno == ENOENT) {
            want = imapconf_getint(conf, "journal_size");
            if (want < 1048576)
                want = 1048576;
            e = jnl_create(buf_cstring(&dir), buf_cstring(&path),
                           (uint64_t)want & ~(uint64_t)(JNL_ALIGN - 1));
            if (e) {
                close(lfd);
                log_error("journal: cannot create file=<%s> error=<%s>",
                          buf_cstring(&path), strerror(e));
                r = jnl_errno(e);
                goto out;
            }
            log_info("journal: created file=<%s> size=<%ld>",
                     buf_cstring(&path), want);
            fd = open(buf_cstring(&path), O_RDWR | O_CLOEXEC);
        }
        close(lfd);
    }
    if (fd < 0 || fstat(fd, &st) != 0 ||
        fs_pread_all(fd, hdr, sizeof(hdr), 0) < 0) {
        log_error("journal: cannot open file=<%s> error=<%s>",
                  buf_cstring(&path), strerror(errno));
        r = STORE_IOERROR;
        goto out;
    }
    if (jnl_file_header_parse(hdr, &segsize, &ckpt) < 0 ||
        segsize < 2 * JNL_SEG_HDR || segsize % JNL_ALIGN) {
        log_error("journal: damaged header file=<%s>", buf_cstring(&path));
        r = STORE_CORRUPT;
        goto out;
    }
    jf = calloc(1, sizeof(*jf));
    if (!jf || !(jf->path = strdup(buf_cstring(&path)))) {
        free(jf);
        r = STORE_NOMEM;
        goto out;
    }
    jf->fd = fd;
    fd = -1;
    jf->dev = (uint64_t)st.st_dev;
    jf->ino = (uint64_t)st.st_ino;
    jf->segsize = segsize;
    jf->pid = getpid();
    jf->next = jnl_files;
    jnl_files = jf;
    *jf_r = jf;
out:
    if (fd >= 0)
        close(fd);
    buf_free(&dir);
    buf_free(&path);
    return r;
}

static off_t jnl_seg_base(const struct jnl_file *jf, unsigned seg)
{
    return (off_t)(JNL_HDR + (uint64_t)seg * jf->segsize);
}

/*
 * Zeros written and synced from js->filled up to `end` rounded up to
 * JNL_ZERO_CHUNK (at most the file's full size), so that the records
 * written there later are overwrites of allocated, written blocks: their
 * fdatasync() then needs no metadata commit.  The first pass over the
 * file pays one fdatasync() per MiB here; later passes nothing.  Mutex
 * held.  0 or an errno.
 */
static int jnl_fill(struct jnl_file *jf, struct commit_journal_state *js,
                    uint64_t end)
{
    static unsigned char *zero;
    uint64_t total = JNL_HDR + 2 * jf->segsize, to;
    int rc;

    if (end <= js->filled)
        return 0;
    to = (end + JNL_ZERO_CHUNK - 1) / JNL_ZERO_CHUNK * JNL_ZERO_CHUNK;
    if (to > total)
        to = total;
    if (!zero && !(zero = calloc(1, JNL_ZERO_CHUNK)))
        return ENOMEM;
    while (js->filled < to) {
        size_t n = to - js->filled < JNL_ZERO_CHUNK ?
                       (size_t)(to - js->filled) : JNL_ZERO_CHUNK;

        if (fs_pwrite_all(jf->fd, zero, n, (off_t)js->filled) != 0)
            return errno;
        do
            rc = fdatasync(jf->fd);
        while (rc < 0 && errno == EINTR);
        if (rc < 0)
            return errno;
        js->filled += n;
    }
    return 0;
}

/* First look at the journal in this boot: NEEDS_REPLAY when a segment is
 * newer than the checkpoint, else a new generation in segment 0.  Mutex
 * held.  0 or an errno. */
static int jnl_state_init(struct jnl_file *jf, struct commit_journal_state *js)
{
    unsigned char hdr[JNL_HDR];
    uint64_t segsize, ckpt, gen, seq, maxgen;
    struct stat st;
    unsigned i;
    int e;

    if (fs_pread_all(jf->fd, hdr, sizeof(hdr), 0) < 0)
        return errno;
    if (jnl_file_header_parse(hdr, &segsize, &ckpt) < 0)
        return EBADMSG;
    maxgen = ckpt;
    if (fstat(jf->fd, &st) != 0)
        return errno;
    js->filled = (uint64_t)st.st_size;
    for (i = 0; i < 2; i++) {
        if ((uint64_t)jnl_seg_base(jf, i) + JNL_SEG_HDR > js->filled)
            break;      /* never written yet */
        if (fs_pread_all(jf->fd, hdr, JNL_SEG_HDR, jnl_seg_base(jf, i)) < 0)
            return errno;
        if (jnl_seg_header_parse(hdr, &gen, &seq) == 0 && gen > ckpt) {
            js->state = JNL_STATE_NEEDS_REPLAY;
            return 0;
        }
        if (jnl_seg_header_parse(hdr, &gen, &seq) == 0 && gen > maxgen)
            maxgen = gen;
    }
    if ((e = jnl_fill(jf, js, (uint64_t)jnl_seg_base(jf, 0) + JNL_SEG_HDR)))
        return e;
    if (get32(hdr + 8) < JNL_VERSION) {
        /* a version-1 file: say 2 before a record of this version is
         * written (the first round's fdatasync carries it) */
        jnl_file_header(hdr, segsize, ckpt);
        if (fs_pwrite_all(jf->fd, hdr, JNL_HDR, 0) != 0)
            return errno;
    }
    jnl_seg_header(hdr, maxgen + 1, 1);
    if (fs_pwrite_all(jf->fd, hdr, JNL_SEG_HDR, jnl_seg_base(jf, 0)) != 0)
        return errno;
    js->segsize = jf->segsize;
    js->active = 0;
    js->gen[0] = maxgen + 1;
    js->gen[1] = 0;
    js->full[0] = js->full[1] = 0;
    js->off = JNL_SEG_HDR;
    js->seq = 1;
    js->written = 0;
    memset(js->inflight, 0, sizeof(js->inflight));
    js->ckpt_pid = 0;
    js->state = JNL_STATE_READY;
    return 0;
}

/* The checkpoint of generation gen on the journal open as fd: everything
 * written before is made durable in place (syncfs), then the mark in the
 * file header (fdatasync).  No shared state.  0 or an errno. */
static int jnl_ckpt_sync(int fd, uint64_t segsize, uint64_t gen)
{
    unsigned char hdr[JNL_HDR];
    int rc;

    if (jnl_test_hold_fd >= 0) {
        char c;

        while (read(jnl_test_hold_fd, &c, 1) < 0 && errno == EINTR)
            ;
    }
    do
        rc = syncfs(fd);
    while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return errno;
    jnl_file_header(hdr, segsize, gen);
    if (fs_pwrite_all(fd, hdr, JNL_HDR, 0) != 0)
        return errno;
    do
        rc = fdatasync(fd);
    while (rc < 0 && errno == EINTR);
    if (rc < 0)
        return errno;
    return 0;
}

/* Checkpoint segment `seg` of generation gen, here and now.  Without the
 * mutex.  0 or an errno. */
static int jnl_checkpoint(const struct imapconf *conf, struct jnl_file *jf,
                          uint64_t gen)
{
    int e = jnl_ckpt_sync(jf->fd, jf->segsize, gen);

    if (!e)
        commit_journal_count(conf, 1);
    return e;
}

/* ---- the checkpoint in the background ------------------------------------
 *
 * The writer that switched segments does not checkpoint the segment it
 * left itself: a thread of its process does (jnl_ckpt_main), so that no
 * delivery waits for the syncfs().  js->ckpt_pid names the process, as
 * before; the thread clears it and the segment's `full` mark (or sets the
 * journal BROKEN) under the mutex when it is done.  Until then a writer
 * that needs the segment waits for it like for another process's
 * checkpoint; one whose process is gone is replaced.  The thread touches
 * no per-process state but its own copy of the descriptor and the mapping
 * of commit.shm (never unmapped), and starts with every signal blocked.
 * The process's exit() waits for it (atexit). */
struct jnl_ckpt {
    struct commit_shm *shm;
    uint64_t dev, ino, segsize, gen;
    unsigned seg;
    int fd;
    char *path;
};

static int jnl_ckpt_threads;          /* running in this process */
static pid_t jnl_ckpt_pid;            /* whose count that is */
static pid_t jnl_ckpt_atexit_pid;

static int jnl_ckpt_running(void)
{
    if (jnl_ckpt_pid != procid_get())
        return 0;                     /* inherited over fork(): not ours */
    return __atomic_load_n(&jnl_ckpt_threads, __ATOMIC_ACQUIRE);
}

void journal_checkpoints_wait(void)
{
    while (jnl_ckpt_running() > 0)
        usleep(1000);
}

static void jnl_ckpt_atexit(void)
{
    journal_checkpoints_wait();
}

static void *jnl_ckpt_main(void *arg)
{
    struct jnl_ckpt *c = arg;
    struct commit_journal_state *js;
    int e = jnl_ckpt_sync(c->fd, c->segsize, c->gen);

    if (!e)
        commit_journal_count_shm(c->shm, 1);
    if (commit_journal_lock_shm(c->shm, c->dev, c->ino, &js) == 0) {
        js->ckpt_pid = 0;
        if (!e && js->gen[c->seg] == c->gen)
            js->full[c->seg] = 0;
        if (e)
            js->state = JNL_STATE_BROKEN;
        commit_journal_unlock_shm(c->shm);
    }
    if (e)
        log_error("journal: checkpoint failed, journal given up until "
                  "replay file=<%s> error=<%s>", c->path, strerror(e));
    close(c->fd);
    free(c->path);
    free(c);
    __atomic_sub_fetch(&jnl_ckpt_threads, 1, __ATOMIC_RELEASE);
    return NULL;
}

/* Start the checkpoint of segment seg (generation gen) in a thread; the
 * caller has set js->ckpt_pid to this process.  0, or -1 when no thread
 * could be started (the caller checkpoints itself). */
static int jnl_ckpt_start(const struct imapconf *conf, struct jnl_file *jf,
                          unsigned seg, uint64_t gen)
{
    struct jnl_ckpt *c;
    pthread_attr_t attr;
    pthread_t thread;
    sigset_t all, old;
    int rc;

    if (!(c = calloc(1, sizeof(*c))))
        return -1;
    c->shm = commit_journal_shm(conf);
    c->dev = jf->dev;
    c->ino = jf->ino;
    c->segsize = jf->segsize;
    c->gen = gen;
    c->seg = seg;
    c->path = strdup(jf->path);
    c->fd = fcntl(jf->fd, F_DUPFD_CLOEXEC, 0);
    if (!c->shm || !c->path || c->fd < 0) {
        if (c->fd >= 0)
            close(c->fd);
        free(c->path);
        free(c);
        return -1;
    }
    if (jnl_ckpt_pid != procid_get()) {
        jnl_ckpt_pid = procid_get();
        jnl_ckpt_threads = 0;
    }
    if (jnl_ckpt_atexit_pid != procid_get() && atexit(jnl_ckpt_atexit) == 0)
        jnl_ckpt_atexit_pid = procid_get();
    __atomic_add_fetch(&jnl_ckpt_threads, 1, __ATOMIC_RELEASE);
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    rc = pthread_attr_init(&attr);
    if (rc == 0) {
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        rc = pthread_create(&thread, &attr, jnl_ckpt_main, c);
        pthread_attr_destroy(&attr);
    }
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (rc != 0) {
        __atomic_sub_fetch(&jnl_ckpt_threads, 1, __ATOMIC_RELEASE);
        close(c->fd);
        free(c->path);
        free(c);
        return -1;
    }
    return 0;
}

static int jnl_pid_alive(pid_t pid)
{
    return pid > 0 && (kill(pid, 0) == 0 || errno != ESRCH);
}

/* A record being written: its head (header and entries), the message
 * bytes (the caller's, or read back into `own`) and the zero padding. */
struct jnl_rec {
    unsigned char *head;
    uint32_t hlen;
    const unsigned char *msg;
    unsigned char *own;
    uint32_t msize;
    uint32_t pad;
    uint32_t len;                /* hlen + msize + pad */
    int digest;                  /* the message is covered by the SHA-1 */
};

static const unsigned char jnl_zeros[JNL_ALIGN];

static void jnl_rec_free(struct jnl_rec *r)
{
    free(r->head);
    free(r->own);
    memset(r, 0, sizeof(*r));
}

/*
 * Build the record (without generation, sequence and CRC) into *r.  With
 * msg, the bytes are msg's and, every entry having the same digest (the
 * caller vouches that it is their SHA-1), the CRC will leave them out
 * (field 36 = their offset): neither read nor checksummed again.  Without
 * msg they are read from msgfd and the CRC covers them.
 */
static int jnl_build(int msgfd, const void *msg, uint32_t msgsize,
                     const struct journal_entry *ents, size_t n,
                     struct jnl_rec *r)
{
    uint64_t hlen = JNL_REC_HDR, len;
    unsigned char *p;
    size_t i, k, ml, pl, kl;

    memset(r, 0, sizeof(*r));
    if (n > 65535)
        return STORE_NOTIMPLEMENTED;
    for (i = 0; i < n; i++) {
        ml = strlen(ents[i].mailbox);
        pl = ents[i].partition ? strlen(ents[i].partition) : 0;
        if (ml > 65535 || pl > 65535 || ents[i].nkeywords > 65535)
            return STORE_NOTIMPLEMENTED;
        hlen += JNL_ENT_FIXED + ml + pl;
        for (k = 0; k < ents[i].nkeywords; k++)
            if (ents[i].keywords[k])
                hlen += 2 + strlen(ents[i].keywords[k]);
    }
    len = (hlen + msgsize + JNL_ALIGN - 1) & ~(uint64_t)(JNL_ALIGN - 1);
    if (len > UINT32_MAX)
        return STORE_NOTIMPLEMENTED;
    r->head = calloc(1, (size_t)hlen);
    if (!r->head)
        return STORE_NOMEM;
    r->hlen = (uint32_t)hlen;
    r->msize = msgsize;
    r->len = (uint32_t)len;
    r->pad = (uint32_t)(len - hlen - msgsize);
    r->digest = msg != NULL && n > 0;
    for (i = 1; r->digest && i < n; i++)
        if (memcmp(ents[i].info.digest, ents[0].info.digest,
                   MAILBOX_DIGEST_LEN) != 0)
            r->digest = 0;
    put32(r->head, JNL_REC_MAGIC);
    put32(r->head + 4, (uint32_t)len);
    put32(r->head + 24, (uint32_t)n);
    put32(r->head + 28, msgsize);
    put32(r->head + 36, r->digest ? r->hlen : 0);
    p = r->head + JNL_REC_HDR;
    for (i = 0; i < n; i++) {
        const struct journal_entry *e = &ents[i];
        uint16_t nk = 0;

        for (k = 0; k < e->nkeywords; k++)
            if (e->keywords[k] && strlen(e->keywords[k]) <= 65535)
                nk++;
        put32(p, e->uid);
        put32(p + 4, e->uidvalidity);
        put32(p + 8, e->compactions);
        put32(p + 12, e->sysflags);
        put64(p + 16, (uint64_t)e->internaldate);
        put32(p + 24, e->info.size);
        put32(p + 28, e->info.header_size);
        memcpy(p + 32, e->info.digest, MAILBOX_DIGEST_LEN);
        ml = strlen(e->mailbox);
        pl = e->partition ? strlen(e->partition) : 0;
        put16(p + 52, (uint16_t)ml);
        put16(p + 54, (uint16_t)pl);
        put16(p + 56, nk);
        p += JNL_ENT_FIXED;
        memcpy(p, e->mailbox, ml);
        p += ml;
        if (pl)
            memcpy(p, e->partition, pl);
        p += pl;
        for (k = 0; k < e->nkeywords; k++) {
            if (!e->keywords[k] || (kl = strlen(e->keywords[k])) > 65535)
                continue;
            put16(p, (uint16_t)kl);
            memcpy(p + 2, e->keywords[k], kl);
            p += 2 + kl;
        }
    }
    if (msg || !msgsize) {
        r->msg = msg;
        return STORE_OK;
    }
    if (!(r->own = malloc(msgsize))) {
        jnl_rec_free(r);
        return STORE_NOMEM;
    }
    if (fs_pread_all(msgfd, r->own, msgsize, 0) < 0) {
        log_error("journal: cannot read the staged message error=<%s>",
                  strerror(errno));
        jnl_rec_free(r);
        return STORE_IOERROR;
    }
    r->msg = r->own;
    return STORE_OK;
}

/* Generation, sequence and CRC into the record's head. */
static void jnl_rec_seal(struct jnl_rec *r, uint64_t gen, uint64_t seq)
{
    uint32_t c;

    put64(r->head + 8, gen);
    put64(r->head + 16, seq);
    put32(r->head + 32, 0);
    c = crc32c_update(CRC32C_INIT, r->head, r->hlen);
    if (!r->digest && r->msize)
        c = crc32c_update(c, r->msg, r->msize);
    c = crc32c_update(c, jnl_zeros, r->pad);
    put32(r->head + 32, crc32c_final(c));
}

/* pwritev() of the record at off, all of it.  0 or -1 (errno). */
static int jnl_rec_write(int fd, const struct jnl_rec *r, off_t off)
{
    struct iovec iov[3];
    int cnt = 0, i = 0;
    ssize_t w;

    iov[cnt].iov_base = r->head;
    iov[cnt++].iov_len = r->hlen;
    if (r->msize) {
        iov[cnt].iov_base = (void *)r->msg;
        iov[cnt++].iov_len = r->msize;
    }
    if (r->pad) {
        iov[cnt].iov_base = (void *)jnl_zeros;
        iov[cnt++].iov_len = r->pad;
    }
    while (i < cnt) {
        w = pwritev(fd, iov + i, cnt - i, off);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            return -1;
        }
        if (w == 0) {
            errno = EIO;
            return -1;
        }
        off += w;
        while (i < cnt && (size_t)w >= iov[i].iov_len)
            w -= (ssize_t)iov[i++].iov_len;
        if (i < cnt) {
            iov[i].iov_base = (char *)iov[i].iov_base + w;
            iov[i].iov_len -= (size_t)w;
        }
    }
    return 0;
}

/* Set the state BROKEN (logged). */
static void jnl_break(const struct imapconf *conf, struct jnl_file *jf, int e,
                      const char *what)
{
    struct commit_journal_state *js;

    log_error("journal: %s failed, journal given up until replay "
              "file=<%s> error=<%s>", what, jf->path, strerror(e));
    if (commit_journal_lock(conf, jf->dev, jf->ino, &js) == 0) {
        js->state = JNL_STATE_BROKEN;
        commit_journal_unlock(conf);
    }
}

/* Mark record seq written (mutex held) and advance js->written over every
 * record written in sequence; wake the waiters when it moved. */
static void jnl_written(struct commit_journal_state *js, uint64_t seq)
{
    struct commit_journal_write *w;
    uint64_t before = js->written;

    w = &js->inflight[seq % COMMIT_JOURNAL_INFLIGHT];
    if (w->seq == seq && w->state == JNL_W_WRITING)
        w->state = JNL_W_DONE;
    for (;;) {
        w = &js->inflight[(js->written + 1) % COMMIT_JOURNAL_INFLIGHT];
        if (w->seq != js->written + 1 || w->state != JNL_W_DONE)
            break;
        w->state = JNL_W_FREE;
        js->written++;
    }
    if (js->written != before) {
        __atomic_add_fetch(&js->wake, 1, __ATOMIC_RELEASE);
        if (js->waiters)
            syscall(SYS_futex, &js->wake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    }
}

/* A record with no entries and no message, of length len, sequence seq
 * and generation gen, written at off in place of the record of a writer
 * that died before its pwrite() finished, so that replay's run of valid
 * records goes on past it.  0 or an errno. */
static int jnl_write_filler(struct jnl_file *jf, uint64_t off, uint32_t len,
                            uint64_t gen, uint64_t seq)
{
    unsigned char *rec = calloc(1, len);
    int e = 0;

    if (!rec)
        return ENOMEM;
    put32(rec, JNL_REC_MAGIC);
    put32(rec + 4, len);
    put64(rec + 8, gen);
    put64(rec + 16, seq);
    put32(rec + 32, jnl_rec_crc(rec, len));
    if (fs_pwrite_all(jf->fd, rec, len, (off_t)off) != 0)
        e = errno;
    free(rec);
    return e;
}

/*
 * Wait until every record up to sequence upto is written (js->written >=
 * upto), writing a filler for a writer found dead.  Returns 0 with the
 * mutex held and *js_r, or an errno without the mutex.
 */
static int jnl_wait_written(const struct imapconf *conf, struct jnl_file *jf,
                            uint64_t upto, struct commit_journal_state **js_r)
{
    struct timespec ts = { 0, JNL_WAIT_NS };
    struct commit_journal_state *js;
    struct commit_journal_write *w;
    uint32_t wake;
    int e;

    if ((e = commit_journal_lock(conf, jf->dev, jf->ino, &js)) != 0)
        return e;
    for (;;) {
        if (js->written >= upto || js->state != JNL_STATE_READY) {
            *js_r = js;
            return 0;
        }
        w = &js->inflight[(js->written + 1) % COMMIT_JOURNAL_INFLIGHT];
        if (w->seq == js->written + 1 && w->state == JNL_W_WRITING &&
            !jnl_pid_alive(w->pid)) {
            uint64_t off = w->off, gen = w->gen, seq = w->seq;
            uint32_t len = w->len;

            log_warning("journal: a writer died before its record was "
                        "written, filler written pid=<%ld> seq=<%llu>",
                        (long)w->pid, (unsigned long long)seq);
            w->pid = procid_get();
            commit_journal_unlock(conf);
            e = jnl_write_filler(jf, off, len, gen, seq);
            if (commit_journal_lock(conf, jf->dev, jf->ino, &js) != 0)
                return e ? e : ENOTRECOVERABLE;
            if (e)
                js->state = JNL_STATE_BROKEN;
            jnl_written(js, seq);
            if (e) {
                commit_journal_unlock(conf);
                log_error("journal: filler write failed, journal given up "
                          "until replay file=<%s> error=<%s>", jf->path,
                          strerror(e));
                if ((e = commit_journal_lock(conf, jf->dev, jf->ino,
                                             &js)) != 0)
                    return e;
            }
            continue;
        }
        /* counted as a waiter from the look at wake to the end of the
         * wait: jnl_written() wakes only when somebody waits */
        wake = __atomic_load_n(&js->wake, __ATOMIC_ACQUIRE);
        js->waiters++;
        commit_journal_unlock(conf);
        syscall(SYS_futex, &js->wake, FUTEX_WAIT, wake, &ts, NULL, 0);
        if ((e = commit_journal_lock(conf, jf->dev, jf->ino, &js)) != 0)
            return e;
        if (js->waiters)
            js->waiters--;
    }
}

int journal_commit(const struct imapconf *conf, const char *partition,
                   int msgfd, const void *msg, uint32_t msgsize,
                   const struct journal_entry *entries, size_t n)
{
    struct commit_journal_state *js;
    struct jnl_file *jf;
    unsigned char seghdr[JNL_SEG_HDR];
    struct jnl_rec rec;
    uint32_t len;
    uint64_t ckpt_gen = 0, seq, gen, off;
    unsigned other;
    int r, e;

    if ((r = jnl_open(conf, partition, &jf)) != STORE_OK) {
        if (r != STORE_BUSY)
            jnl_fallback(1, "journal file unusable", NULL);
        return STORE_NOTIMPLEMENTED;  /* LOCKED: another one creates it */
    }
    if ((r = jnl_build(msgfd, msg, msgsize, entries, n, &rec)) != STORE_OK)
        return r == STORE_NOTIMPLEMENTED || r == STORE_NOMEM ?
                   STORE_NOTIMPLEMENTED : r;
    len = rec.len;
    if ((uint64_t)len > jf->segsize - JNL_SEG_HDR) {
        jnl_rec_free(&rec);
        return STORE_NOTIMPLEMENTED;    /* bigger than a segment */
    }

    for (;;) {
        if ((e = commit_journal_lock(conf, jf->dev, jf->ino, &js)) != 0) {
            jnl_rec_free(&rec);
            jnl_fallback(2, "shared state unusable", jf->path);
            return STORE_NOTIMPLEMENTED;
        }
        if (js->state == JNL_STATE_NEW &&
            (e = jnl_state_init(jf, js)) != 0) {
            commit_journal_unlock(conf);
            jnl_rec_free(&rec);
            jnl_break(conf, jf, e, "start");
            return STORE_NOTIMPLEMENTED;
        }
        if (js->state != JNL_STATE_READY) {
            int st = js->state;

            commit_journal_unlock(conf);
            jnl_rec_free(&rec);
            if (st == JNL_STATE_NEEDS_REPLAY)
                jnl_fallback(4, "records wait for replay (ctl_cyrusdb -r)",
                             jf->path);
            else if (st == JNL_STATE_BROKEN)
                jnl_fallback(8, "given up after an I/O error", jf->path);
            return STORE_NOTIMPLEMENTED;
        }
        if (js->seq - js->written > COMMIT_JOURNAL_INFLIGHT) {
            /* every in-flight slot taken: wait for the oldest */
            uint64_t want = js->seq - COMMIT_JOURNAL_INFLIGHT;

            commit_journal_unlock(conf);
            if ((e = jnl_wait_written(conf, jf, want, &js)) != 0) {
                jnl_rec_free(&rec);
                return STORE_NOTIMPLEMENTED;
            }
            commit_journal_unlock(conf);
            continue;
        }
        if (js->off + len <= js->segsize)
            break;
        /* switching segments: every record of the one left must be
         * written first (its checkpoint covers them, and a segment is
         * reused only after its checkpoint) */
        if (js->written + 1 < js->seq) {
            uint64_t want = js->seq - 1;

            commit_journal_unlock(conf);
            if ((e = jnl_wait_written(conf, jf, want, &js)) != 0) {
                jnl_rec_free(&rec);
                return STORE_NOTIMPLEMENTED;
            }
            commit_journal_unlock(conf);
            continue;
        }
        /* switch segments; the other one must be checkpointed */
        other = 1 - js->active;
        if (js->full[other]) {
            pid_t cp = js->ckpt_pid;
            uint64_t g = js->gen[other];

            if (cp && (cp != procid_get() ? jnl_pid_alive(cp)
                                          : jnl_ckpt_running() > 0)) {
                commit_journal_unlock(conf);
                usleep(1000);
                continue;
            }
            js->ckpt_pid = procid_get();
            commit_journal_unlock(conf);
            e = jnl_checkpoint(conf, jf, g);
            if (commit_journal_lock(conf, jf->dev, jf->ino, &js) != 0) {
                jnl_rec_free(&rec);
                return STORE_NOTIMPLEMENTED;
            }
            js->ckpt_pid = 0;
            if (!e && js->gen[other] == g)
                js->full[other] = 0;
            commit_journal_unlock(conf);
            if (e) {
                jnl_rec_free(&rec);
                jnl_break(conf, jf, e, "checkpoint");
                return STORE_NOTIMPLEMENTED;
            }
            continue;
        }
        {
            uint64_t g = (js->gen[0] > js->gen[1] ? js->gen[0] : js->gen[1])
                         + 1;

            jnl_seg_header(seghdr, g, js->seq);
            if ((e = jnl_fill(jf, js, (uint64_t)jnl_seg_base(jf, other) +
                                      JNL_SEG_HDR)) != 0 ||
                fs_pwrite_all(jf->fd, seghdr, JNL_SEG_HDR,
                              jnl_seg_base(jf, other)) != 0) {
                if (!e)
                    e = errno;
                commit_journal_unlock(conf);
                jnl_rec_free(&rec);
                jnl_break(conf, jf, e, "segment header write");
                return STORE_NOTIMPLEMENTED;
            }
            js->full[js->active] = 1;
            ckpt_gen = js->gen[js->active];
            js->active = other;
            js->gen[other] = g;
            js->off = JNL_SEG_HDR;
        }
        commit_journal_unlock(conf);
    }

    /* mutex held, room in the active segment: reserve offset and
     * sequence (zeros made sure of first), then write without the mutex */
    if ((e = jnl_fill(jf, js, (uint64_t)jnl_seg_base(jf, js->active) +
                              js->off + len)) != 0) {
        commit_journal_unlock(conf);
        jnl_rec_free(&rec);
        jnl_break(conf, jf, e, "zero fill");
        return jnl_errno(e);
    }
    {
        struct commit_journal_write *w;

        seq = js->seq;
        gen = js->gen[js->active];
        off = (uint64_t)jnl_seg_base(jf, js->active) + js->off;
        w = &js->inflight[seq % COMMIT_JOURNAL_INFLIGHT];
        w->seq = seq;
        w->off = off;
        w->gen = gen;
        w->len = len;
        w->pid = (int32_t)procid_get();
        w->state = JNL_W_WRITING;
        js->off += len;
        js->seq = seq + 1;
    }
    commit_journal_unlock(conf);
    if (jnl_test_die)
        kill(getpid(), SIGKILL);

    jnl_rec_seal(&rec, gen, seq);
    e = jnl_rec_write(jf->fd, &rec, (off_t)off) != 0 ? errno : 0;
    jnl_rec_free(&rec);
    if (commit_journal_lock(conf, jf->dev, jf->ino, &js) != 0)
        return STORE_NOTIMPLEMENTED;   /* the mutex is unrecoverable */
    if (e)
        js->state = JNL_STATE_BROKEN;  /* a hole: later records are not
                                        * acknowledged through the journal */
    jnl_written(js, seq);
    if (e) {
        commit_journal_unlock(conf);
        jnl_break(conf, jf, e, "record write");
        return jnl_errno(e);
    }
    commit_journal_count(conf, 0);

    /* the round must begin after every record up to ours is written, so
     * that it makes the run of valid records reaching ours durable; when
     * they are already (the common case), the round is joined under the
     * same hold of the mutex */
    if (js->written < seq && js->state == JNL_STATE_READY) {
        commit_journal_unlock(conf);
        if ((e = jnl_wait_written(conf, jf, seq, &js)) != 0)
            return STORE_NOTIMPLEMENTED;
    }
    if (js->state != JNL_STATE_READY) {
        /* an earlier record was not written (I/O error): ours may sit
         * behind a hole; the group way makes the delivery durable */
        commit_journal_unlock(conf);
        return STORE_NOTIMPLEMENTED;
    }

    if (jnl_test_errno) {
        commit_journal_unlock(conf);
        e = jnl_test_errno;
        jnl_test_errno = 0;
    } else {
        e = commit_journal_round_held(conf, jf->dev, jf->ino, jf->fd);
    }
    if (e) {
        jnl_break(conf, jf, e, "fdatasync round");
        return jnl_errno(e);
    }

    /* this writer switched segments: checkpoint the one it left, unless
     * somebody else is at it or has done it; in a thread, so that this
     * delivery does not wait for it */
    if (ckpt_gen && commit_journal_lock(conf, jf->dev, jf->ino, &js) == 0) {
        unsigned seg = js->gen[0] == ckpt_gen ? 0 : 1;
        int run = js->full[seg] && js->gen[seg] == ckpt_gen &&
                  (!js->ckpt_pid || !jnl_pid_alive(js->ckpt_pid));

        if (run)
            js->ckpt_pid = procid_get();
        commit_journal_unlock(conf);
        if (run && jnl_ckpt_start(conf, jf, seg, ckpt_gen) != 0) {
            /* no thread: here, after the round (the delivery waits) */
            e = jnl_checkpoint(conf, jf, ckpt_gen);
            if (commit_journal_lock(conf, jf->dev, jf->ino, &js) == 0) {
                js->ckpt_pid = 0;
                if (!e && js->gen[seg] == ckpt_gen)
                    js->full[seg] = 0;
                commit_journal_unlock(conf);
            }
            if (e)
                jnl_break(conf, jf, e, "checkpoint");
            /* the delivery itself is durable either way */
        }
    }
    return STORE_OK;
}

/* ---- replay ------------------------------------------------------------- */

/* One reservation found in the journal, pointing into the mapping. */
struct jnl_rent {
    char *mailbox, *partition;
    uint32_t uid, uidvalidity, compactions, sysflags;
    int64_t internaldate;
    struct mailbox_msginfo info;
    char **keywords;
    size_t nkeywords;
    const unsigned char *msg;    /* the message bytes (info.size) */
    uint64_t order;              /* generation and sequence, for sorting */
};

static void jnl_rent_free(struct jnl_rent *re)
{
    size_t k;

    free(re->mailbox);
    free(re->partition);
    for (k = 0; k < re->nkeywords; k++)
        free(re->keywords[k]);
    free(re->keywords);
}

static char *jnl_strndup(const unsigned char *p, size_t n)
{
    char *s = malloc(n + 1);

    if (s) {
        memcpy(s, p, n);
        s[n] = '\0';
    }
    return s;
}

/* Parse the entries of a valid record into *list.  -1: malformed (the
 * CRC was good, so written so: a bug; the record is skipped, logged). */
static int jnl_parse_record(const unsigned char *rec, uint32_t len,
                            uint64_t order, struct jnl_rent **list,
                            size_t *n, size_t *alloc)
{
    uint32_t nent = get32(rec + 24), msgsize = get32(rec + 28), i;
    uint32_t moff = get32(rec + 36);
    const unsigned char *p = rec + JNL_REC_HDR, *end = rec + len;
    size_t first = *n, k;

    for (i = 0; i < nent; i++) {
        struct jnl_rent *re;
        uint16_t ml, pl, nk;

        if (end - p < 58)
            goto bad;
        if (*n == *alloc) {
            size_t na = *alloc ? *alloc * 2 : 64;
            struct jnl_rent *nl = realloc(*list, na * sizeof(*nl));

            if (!nl)
                goto bad;
            *list = nl;
            *alloc = na;
        }
        re = &(*list)[*n];
        memset(re, 0, sizeof(*re));
        re->uid = get32(p);
        re->uidvalidity = get32(p + 4);
        re->compactions = get32(p + 8);
        re->sysflags = get32(p + 12) & MAILBOX_SYSTEM_FLAGS;
        re->internaldate = (int64_t)get64(p + 16);
        re->info.size = get32(p + 24);
        re->info.header_size = get32(p + 28);
        memcpy(re->info.digest, p + 32, MAILBOX_DIGEST_LEN);
        if (moff && memcmp(re->info.digest, rec + JNL_REC_HDR + 32,
                           MAILBOX_DIGEST_LEN) != 0)
            goto bad;     /* the SHA-1 checked was the first entry's */
        ml = get16(p + 52);
        pl = get16(p + 54);
        nk = get16(p + 56);
        p += 58;
        if (end - p < (ptrdiff_t)ml + pl || re->info.size != msgsize)
            goto bad;
        re->mailbox = jnl_strndup(p, ml);
        re->partition = jnl_strndup(p + ml, pl);
        p += ml + pl;
        (*n)++;
        if (!re->mailbox || !re->partition)
            goto bad;
        if (nk) {
            re->keywords = calloc(nk, sizeof(char *));
            if (!re->keywords)
                goto bad;
        }
        for (k = 0; k < nk; k++) {
            uint16_t kl;

            if (end - p < 2)
                goto bad;
            kl = get16(p);
            if (end - p < 2 + (ptrdiff_t)kl)
                goto bad;
            re->keywords[k] = jnl_strndup(p + 2, kl);
            re->nkeywords++;
            if (!re->keywords[k])
                goto bad;
            p += 2 + kl;
        }
        re->order = order;
    }
    if ((uint64_t)(end - p) < msgsize || (moff && p != rec + moff))
        goto bad;
    for (k = first; k < *n; k++)
        (*list)[k].msg = p;
    return 0;
bad:
    while (*n > first)
        jnl_rent_free(&(*list)[--*n]);
    return -1;
}

/* The valid records of segment seg (generation gen, first sequence seq)
 * into *list.  Returns the number of records. */
static unsigned long jnl_scan_segment(const unsigned char *base,
                                      uint64_t segsize, uint64_t gen,
                                      uint64_t seq, struct jnl_rent **list,
                                      size_t *n, size_t *alloc)
{
    uint64_t off = JNL_SEG_HDR;
    unsigned long count = 0;

    while (off + JNL_REC_HDR <= segsize) {
        const unsigned char *rec = base + off;
        uint32_t len = get32(rec + 4);

        if (get32(rec) != JNL_REC_MAGIC || len < JNL_REC_HDR ||
            len % JNL_ALIGN || len > segsize - off || get64(rec + 8) != gen ||
            get64(rec + 16) != seq || !jnl_rec_intact(rec, len))
            break;
        if (jnl_parse_record(rec, len, (gen << 32) ^ seq, list, n,
                             alloc) < 0)
            log_error("journal: malformed record skipped generation=<%llu> "
                      "sequence=<%llu>", (unsigned long long)gen,
                      (unsigned long long)seq);
        count++;
        seq++;
        off += len;
    }
    return count;
}

static int jnl_rent_cmp(const void *a, const void *b)
{
    const struct jnl_rent *x = a, *y = b;
    int c = strcmp(x->mailbox, y->mailbox);

    if (c)
        return c;
    return x->uid < y->uid ? -1 : x->uid > y->uid;
}

/* Does the file at path hold exactly the entry's bytes? */
static int jnl_file_matches(const char *path, const struct jnl_rent *re)
{
    unsigned char md[SHA_DIGEST_LENGTH], buf[65536];
    struct stat st;
    SHA_CTX c;
    ssize_t k;
    int fd, ok = 0;

    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    if (fstat(fd, &st) == 0 && (uint64_t)st.st_size == re->info.size) {
        SHA1_Init(&c);
        while ((k = read(fd, buf, sizeof(buf))) > 0)
            SHA1_Update(&c, buf, (size_t)k);
        SHA1_Final(md, &c);
        ok = k == 0 && memcmp(md, re->info.digest, sizeof(md)) == 0;
    }
    close(fd);
    return ok;
}

/* Write the entry's bytes to path (through path.jnl + rename; not
 * synced: the replay's checkpoint does that).  STORE_OK or an error. */
static int jnl_write_file(const char *path, const struct jnl_rent *re)
{
    char tmp[PATH_MAX];
    int fd, e = 0;

    if (snprintf(tmp, sizeof(tmp), "%s.jnl", path) >= (int)sizeof(tmp))
        return STORE_IOERROR;
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, JNL_FILE_MODE);
    if (fd < 0)
        return jnl_errno(errno);
    if (fs_write_all(fd, re->msg, re->info.size) != 0)
        e = errno;
    if (close(fd) != 0 && !e)
        e = errno;
    if (!e && rename(tmp, path) != 0)
        e = errno;
    if (e) {
        unlink(tmp);
        log_error("journal: cannot restore message file file=<%s> "
                  "error=<%s>", path, strerror(e));
        return jnl_errno(e);
    }
    return STORE_OK;
}

/* Find uid in mb (locked): 1 and *rec, 0 when absent, or a negative
 * store code.  When the binary search meets a damaged record (an index
 * that lost pages, read before its recovery), every intact record is
 * looked at instead: a damaged record never hides an intact one. */
static int jnl_find(struct mailbox *mb, uint32_t uid,
                    struct mailbox_record *rec, uint32_t *recno_r)
{
    uint32_t recno, n;
    int r = mailbox_find_uid(mb, uid, &recno);

    *recno_r = 0;
    if (r == STORE_NOTFOUND)
        return 0;
    if (r == STORE_OK) {
        *recno_r = recno;
        r = mailbox_read_record(mb, recno, rec);
        return r ? -r : 1;
    }
    if (r != STORE_CORRUPT)
        return -r;
    n = mailbox_get_header(mb)->visible;
    for (recno = 0; recno < n; recno++)
        if (mailbox_read_record(mb, recno, rec) == STORE_OK &&
            rec->uid == uid) {
            *recno_r = recno;
            return 1;
        }
    return 0;
}

/* After a rebuild, which keeps no flags of a record that was lost: the
 * record's flags and keywords from the journal, when it has none. */
static void jnl_restore_flags(struct mailbox *mb, uint32_t recno,
                              struct mailbox_record *rec,
                              const struct jnl_rent *re)
{
    size_t k;
    int num, any = 0;

    for (k = 0; k < MAILBOX_USER_FLAGS / 32; k++)
        if (rec->user_flags[k])
            return;
    if ((rec->flags & MAILBOX_SYSTEM_FLAGS) || (!re->sysflags && !re->nkeywords))
        return;
    rec->flags = (rec->flags & ~MAILBOX_SYSTEM_FLAGS) | re->sysflags;
    for (k = 0; k < re->nkeywords; k++)
        if (mailbox_user_flag(mb, re->keywords[k], 1, &num) == STORE_OK) {
            rec->user_flags[num / 32] |= 1u << (num % 32);
            any = 1;
        }
    if (re->sysflags || any)
        (void)mailbox_rewrite_record(mb, recno, rec);
}

/* Put uid back into mb (unlocked handle): reservations until uidnext
 * reaches it (the ones below it cancelled: lost aborted appends), then
 * the entry's. */
static int jnl_add_record(const struct imapconf *conf, struct mailbox *mb,
                          const char *tmpdir, const struct jnl_rent *re)
{
    char tmp[PATH_MAX];
    uint32_t got = 0;
    int r, tries;

    if (snprintf(tmp, sizeof(tmp), "%s/replay.%ld", tmpdir,
                 (long)getpid()) >= (int)sizeof(tmp))
        return STORE_IOERROR;
    if ((r = jnl_write_file(tmp, re)) != STORE_OK)
        return r;
    (void)conf;
    for (tries = 0; tries < 1000000; tries++) {
        r = mailbox_append_reserve_keywords(mb, tmp, &re->info,
                                            re->internaldate, re->sysflags,
                                            (const char *const *)re->keywords,
                                            re->nkeywords, 0, NULL, &got);
        if (r || got >= re->uid)
            break;      /* uid 0: the first one given */
        mailbox_append_cancel(mb, got);
    }
    if (!r && re->uid && got != re->uid) {
        log_error("journal: uid already taken mailbox=<%s> uid=<%u> got=<%u>",
                  re->mailbox, re->uid, got);
        mailbox_append_cancel(mb, got);
        r = STORE_EXISTS;
    }
    if (!r)
        r = mailbox_append_finish(mb, got);
    unlink(tmp);
    return r;
}

/* Write the entry's file when it does not hold the entry's bytes: the
 * journal is the authority for a uid it covers (a file of that name may
 * be a torn write).  1 written, 0 already right, or a negative code. */
static int jnl_restore_file(struct mailbox *mb, const struct jnl_rent *re,
                            struct buf *path)
{
    int r;

    buf_reset(path);
    mailbox_message_path(mb, re->uid, path);
    if (jnl_file_matches(buf_cstring(path), re))
        return 0;
    r = jnl_write_file(buf_cstring(path), re);
    return r ? -r : 1;
}

/* Is rec an aborted placeholder that the mailbox recovery put where a
 * damaged record was (no size, no digest)? */
static int jnl_placeholder(const struct mailbox_record *rec)
{
    static const unsigned char zero[MAILBOX_DIGEST_LEN];

    return (rec->flags & MAILBOX_FLAG_ABORTED) && rec->size == 0 &&
           memcmp(rec->digest, zero, MAILBOX_DIGEST_LEN) == 0;
}

/* Rebuild the index of mailbox `name` (*mbp closed, reopened on success)
 * from its verified files: the files of the entries that are ours are
 * written again first (the index recovery may have unlinked one as a
 * stale reservation), then mailbox_reconstruct_verified() with them as
 * the known messages, so that no torn file of a delivery never
 * acknowledged becomes a message. */
static int jnl_rebuild(const struct imapconf *conf, struct mailbox **mbp,
                       const struct jnl_rent *ents, const unsigned char *ours,
                       size_t n, struct journal_replay_stats *st)
{
    const char *name = ents[0].mailbox;
    const char *part = ents[0].partition[0] ? ents[0].partition : NULL;
    struct mailbox_known *known;
    struct buf path = BUF_INITIALIZER;
    size_t i, nk = 0;
    int r = STORE_OK, w;

    known = calloc(n ? n : 1, sizeof(*known));
    if (!known)
        return STORE_NOMEM;
    for (i = 0; i < n; i++) {
        if (!ours[i])
            continue;
        w = jnl_restore_file(*mbp, &ents[i], &path);
        if (w < 0) {
            st->failed++;
            continue;
        }
        if (w > 0)
            st->files_written++;
        known[nk].uid = ents[i].uid;
        known[nk].size = ents[i].info.size;
        memcpy(known[nk].digest, ents[i].info.digest, MAILBOX_DIGEST_LEN);
        nk++;
    }
    mailbox_close(mbp);
    r = mailbox_reconstruct_verified(conf, name, part, known, nk, NULL);
    st->reconstructs++;
    if (!r)
        r = mailbox_open(conf, name, part, mbp);
    free(known);
    buf_free(&path);
    return r;
}

/* Replay the entries [i, j) of one mailbox (sorted by uid). */
static void jnl_replay_mailbox(const struct imapconf *conf,
                               const char *tmpdir, struct jnl_rent *ents,
                               size_t n, struct journal_replay_stats *st)
{
    const char *name = ents[0].mailbox;
    struct mailbox *mb = NULL;
    struct mailbox_header h;
    struct mailbox_record rec;
    uint32_t recno;
    struct buf path = BUF_INITIALIZER;
    unsigned char *wrote, *ours, *moved;
    int r, have_h = 0, rebuilt = 0, f;
    size_t i;

    /* per entry: file written by phase 1, ours, to restore under a new
     * uid at the end */
    wrote = calloc(n ? n : 1, 3);
    ours = wrote ? wrote + (n ? n : 1) : NULL;
    moved = wrote ? ours + (n ? n : 1) : NULL;
    r = mailbox_open(conf, name, ents[0].partition[0] ? ents[0].partition
                                                      : NULL, &mb);
    if (r || !wrote) {
        log_warning("journal: mailbox not replayed mailbox=<%s> error=<%s>",
                    name, store_strerror(r ? r : STORE_NOMEM));
        st->skipped += n;
        goto out;
    }
    /* a look without recovery: a dead appender's file may be one this
     * replay restores */
    if (mailbox_lock_peek(mb) == STORE_OK) {
        h = *mailbox_get_header(mb);
        have_h = 1;
    }

    /* the files first: the exclusive lock's recovery must find them.
     * An entry is ours unless the index durably says otherwise: another
     * mailbox of the name, the uid holding another message, expunged or
     * aborted, or expunged and cleaned up since.  The journal is the
     * authority for the bytes of its uids: a file that does not match
     * (missing, torn, empty) is written again. */
    for (i = 0; i < n; i++) {
        if (have_h && h.uidvalidity != ents[i].uidvalidity)
            continue;
        if (have_h) {
            f = jnl_find(mb, ents[i].uid, &rec, &recno);
            if (f == 1 && ((rec.flags & (MAILBOX_FLAG_EXPUNGED |
                                         MAILBOX_FLAG_ABORTED)) ||
                           memcmp(rec.digest, ents[i].info.digest,
                                  MAILBOX_DIGEST_LEN) != 0))
                continue;       /* not ours to write (another message) */
            if (f == 0 && ents[i].uid < h.uidnext &&
                h.compactions != ents[i].compactions)
                continue;
        }
        ours[i] = 1;
        f = jnl_restore_file(mb, &ents[i], &path);
        if (f > 0) {
            wrote[i] = 1;
            st->files_written++;
        } else if (f < 0) {
            st->failed++;
        }
    }
    if (have_h)
        mailbox_unlock(mb);

    r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE);
    if (r == STORE_CORRUPT) {
        /* pages lost in the middle of the index: rebuild it from the
         * files that are verified complete */
        log_warning("journal: index damaged by the loss, reconstructing "
                    "mailbox=<%s>", name);
        rebuilt = 1;
        r = jnl_rebuild(conf, &mb, ents, ours, n, st);
        if (!r)
            r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE);
    }
    if (r) {
        log_error("journal: mailbox cannot be locked mailbox=<%s> error=<%s>",
                  name, store_strerror(r));
        st->failed += n;
        goto out;
    }
    h = *mailbox_get_header(mb);
    for (i = 0; i < n; i++) {
        struct jnl_rent *re = &ents[i];

        if (h.uidvalidity != re->uidvalidity) {
            st->skipped++;      /* another mailbox of the same name */
            continue;
        }
        f = jnl_find(mb, re->uid, &rec, &recno);
        if (f < 0) {
            st->failed++;
            continue;
        }
        if (f == 1) {
            if (memcmp(rec.digest, re->info.digest, MAILBOX_DIGEST_LEN) != 0) {
                if (ours[i] && !rebuilt && jnl_placeholder(&rec)) {
                    /* recovery made our damaged record an aborted
                     * placeholder (mailbox.c, mbx_fill_gaps) and unlinked
                     * the file: a rebuild puts the message back under
                     * its own uid */
                    log_warning("journal: record lost inside the index, "
                                "reconstructing mailbox=<%s> uid=<%u>", name,
                                re->uid);
                    goto rebuild;
                }
                /* the uid was given out again after the loss took the
                 * index's uidnext (a delivery before this replay): the
                 * acknowledged message comes back under a new uid, after
                 * every other entry has its own */
                moved[i] = 1;
            } else if (rec.flags & MAILBOX_FLAG_ABORTED) {
                st->skipped++;  /* a failed commit, never acknowledged */
            } else if (rebuilt) {
                jnl_restore_flags(mb, recno, &rec, re);
            }
            continue;
        }
        if (!ours[i] || (!rebuilt && re->uid < h.uidnext &&
                         h.compactions != re->compactions)) {
            /* expunged and cleaned up since (the compactions of a
             * rebuilt index say nothing: reconstruct moved them) */
            st->skipped++;
            if (wrote[i]) {
                buf_reset(&path);
                mailbox_message_path(mb, re->uid, &path);
                unlink(buf_cstring(&path));
            }
            continue;
        }
        if (re->uid < h.uidnext) {
            /* uidnext reached the disk, the record did not, and later
             * records exist (or recovery cut a torn tail and with it the
             * file): only a rebuild puts it back in order */
            if (rebuilt) {
                log_error("journal: record not restored mailbox=<%s> "
                          "uid=<%u>", name, re->uid);
                st->failed++;
                continue;
            }
            log_warning("journal: record lost inside the index, "
                        "reconstructing mailbox=<%s> uid=<%u>", name, re->uid);
            goto rebuild;
        }
        mailbox_unlock(mb);
        r = jnl_add_record(conf, mb, tmpdir, re);
        if (r) {
            log_error("journal: cannot put the record back mailbox=<%s> "
                      "uid=<%u> error=<%s>", name, re->uid,
                      store_strerror(r));
            st->failed++;
        } else {
            st->records_added++;
        }
        if ((r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE)) != STORE_OK) {
            st->failed += n - i - 1;
            goto out;
        }
        h = *mailbox_get_header(mb);
        continue;
rebuild:
        mailbox_unlock(mb);
        rebuilt = 1;
        r = jnl_rebuild(conf, &mb, ents, ours, n, st);
        if (r || mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE) != 0) {
            st->failed += n - i;
            goto out;
        }
        h = *mailbox_get_header(mb);
        i--;                    /* look again (wraps at 0, then ++) */
    }
    for (i = 0; i < n; i++) {
        struct jnl_rent mv;

        if (!moved[i])
            continue;
        log_warning("journal: uid holds another message, restoring under a "
                    "new uid mailbox=<%s> uid=<%u>", name, ents[i].uid);
        mailbox_unlock(mb);
        mv = ents[i];
        mv.uid = 0;
        r = jnl_add_record(conf, mb, tmpdir, &mv);
        if (r)
            st->failed++;
        else
            st->records_added++;
        if (mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE) != STORE_OK) {
            st->failed++;
            goto out;
        }
    }
    mailbox_unlock(mb);
out:
    if (mb)
        mailbox_close(&mb);
    free(wrote);
    buf_free(&path);
}

/* Set the shared state of the journal file fd names. */
static void jnl_set_state(const struct imapconf *conf, int fd, uint32_t state)
{
    struct commit_journal_state *js;
    struct stat st;

    if (fstat(fd, &st) != 0 ||
        commit_journal_lock(conf, (uint64_t)st.st_dev, (uint64_t)st.st_ino,
                            &js) != 0)
        return;
    js->state = state;
    commit_journal_unlock(conf);
}

int journal_replay(const struct imapconf *conf, const char *partition,
                   struct journal_replay_stats *st_r)
{
    struct journal_replay_stats st;
    struct buf dir = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct jnl_rent *list = NULL;
    size_t n = 0, alloc = 0, i, j;
    uint64_t segsize, ckpt, gen[2] = { 0, 0 }, seq[2] = { 0, 0 }, maxgen;
    unsigned char hdr[JNL_HDR];
    struct stat sb;
    unsigned char *map = MAP_FAILED;
    size_t maplen = 0;
    int fd = -1, r, valid[2] = { 0, 0 }, s, rc;
    uint64_t avail[2] = { 0, 0 };
    unsigned order[2] = { 0, 1 };

    memset(&st, 0, sizeof(st));
    if ((r = jnl_path(conf, partition, &dir, &path)) != STORE_OK)
        goto out;
    fd = open(buf_cstring(&path), O_RDWR | O_CLOEXEC);
    if (fd < 0) {
        struct jnl_file *jf;

        r = errno == ENOENT ? STORE_OK : jnl_errno(errno);
        /* none yet: made now (at the master's start), zeros and all, so
         * that the first pass of the deliveries writes no zeros */
        if (r == STORE_OK && journal_mode(conf) &&
            (r = jnl_open(conf, partition, &jf)) == STORE_OK) {
            struct commit_journal_state *js;
            int e;

            if ((e = commit_journal_lock(conf, jf->dev, jf->ino, &js)) == 0) {
                if (js->filled < JNL_HDR)
                    js->filled = JNL_HDR;
                e = jnl_fill(jf, js, JNL_HDR + 2 * jf->segsize);
                commit_journal_unlock(conf);
            }
            if (e) {
                log_error("journal: cannot fill file=<%s> error=<%s>",
                          jf->path, strerror(e));
                r = jnl_errno(e);
            }
        }
        goto out;
    }
    jnl_set_state(conf, fd, JNL_STATE_REPLAYING);
    if (fstat(fd, &sb) != 0 || fs_pread_all(fd, hdr, JNL_HDR, 0) < 0) {
        r = STORE_IOERROR;
        goto out;
    }
    if (jnl_file_header_parse(hdr, &segsize, &ckpt) < 0 ||
        segsize < 2 * JNL_SEG_HDR || segsize % JNL_ALIGN) {
        /* the header is written once at creation and then only in place:
         * unreadable = damaged; every record may matter */
        log_error("journal: damaged header, replaying nothing file=<%s>",
                  buf_cstring(&path));
        r = STORE_CORRUPT;
        goto out;
    }
    /* the file is as long as it was ever filled (jnl_fill) */
    maplen = (size_t)sb.st_size;
    if ((uint64_t)maplen > JNL_HDR + 2 * segsize)
        maplen = (size_t)(JNL_HDR + 2 * segsize);
    map = mmap(NULL, maplen, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
        r = STORE_IOERROR;
        goto out;
    }
    maxgen = ckpt;
    for (s = 0; s < 2; s++) {
        uint64_t base = JNL_HDR + (uint64_t)s * segsize;

        avail[s] = maplen > base ? maplen - base : 0;
        if (avail[s] > segsize)
            avail[s] = segsize;
        valid[s] = avail[s] >= JNL_SEG_HDR &&
                   jnl_seg_header_parse(map + base, &gen[s], &seq[s]) == 0;
        if (valid[s] && gen[s] > maxgen)
            maxgen = gen[s];
    }
    if (valid[1] && (!valid[0] || gen[1] < gen[0])) {
        order[0] = 1;
        order[1] = 0;
    }
    for (s = 0; s < 2; s++) {
        unsigned g = order[s];

        if (!valid[g] || gen[g] <= ckpt)
            continue;
        st.records += jnl_scan_segment(map + JNL_HDR + g * segsize, avail[g],
                                       gen[g], seq[g], &list, &n, &alloc);
    }
    st.entries = n;
    if (n)
        log_info("journal: replaying file=<%s> records=<%lu> entries=<%zu>",
                 buf_cstring(&path), st.records, n);

    /* per mailbox, in uid order (qsort is not stable; uids are unique
     * per mailbox) */
    if (n)
        qsort(list, n, sizeof(*list), jnl_rent_cmp);
    for (i = 0; i < n; i = j) {
        for (j = i + 1; j < n && strcmp(list[j].mailbox, list[i].mailbox) == 0;
             j++)
            ;
        jnl_replay_mailbox(conf, buf_cstring(&dir), list + i, j - i, &st);
    }

    /* the checkpoint: everything restored (and everything else) durable,
     * then every generation so far is done */
    do
        rc = syncfs(fd);
    while (rc < 0 && errno == EINTR);
    if (rc == 0) {
        jnl_file_header(hdr, segsize, maxgen);
        if (fs_pwrite_all(fd, hdr, JNL_HDR, 0) != 0 || fdatasync(fd) != 0)
            rc = -1;
    }
    if (rc != 0) {
        log_error("journal: checkpoint after replay failed file=<%s> "
                  "error=<%s>", buf_cstring(&path), strerror(errno));
        r = STORE_IOERROR;
        goto out;
    }
    commit_journal_count(conf, 1);
    if (n || st.failed)
        log_info("journal: replayed file=<%s> records=<%lu> entries=<%lu> "
                 "files=<%lu> added=<%lu> reconstructs=<%lu> skipped=<%lu> "
                 "failed=<%lu>", buf_cstring(&path), st.records, st.entries,
                 st.files_written, st.records_added, st.reconstructs,
                 st.skipped, st.failed);
    r = STORE_OK;
out:
    if (fd >= 0) {
        /* a new generation at the next commit; a failed replay leaves the
         * journal unused (NEEDS_REPLAY is what the next start finds) */
        jnl_set_state(conf, fd, r == STORE_OK ? JNL_STATE_NEW
                                              : JNL_STATE_NEEDS_REPLAY);
        close(fd);
    }
    if (map != MAP_FAILED)
        munmap(map, maplen);
    for (i = 0; i < n; i++)
        jnl_rent_free(&list[i]);
    free(list);
    buf_free(&dir);
    buf_free(&path);
    if (st_r)
        *st_r = st;
    return r;
}

struct jnl_parts {
    const struct imapconf *conf;
    struct journal_replay_stats sum;
    int first;
};

static void jnl_replay_one(void *rock, const char *key, const char *value,
                           const char *def, unsigned long line)
{
    struct jnl_parts *jp = rock;
    struct journal_replay_stats st;
    int r;

    (void)value;
    (void)def;
    (void)line;
    if (strncasecmp(key, "partition-", 10) != 0 || !key[10])
        return;
    r = journal_replay(jp->conf, key + 10, &st);
    if (r && !jp->first)
        jp->first = r;
    jp->sum.records += st.records;
    jp->sum.entries += st.entries;
    jp->sum.files_written += st.files_written;
    jp->sum.records_added += st.records_added;
    jp->sum.reconstructs += st.reconstructs;
    jp->sum.skipped += st.skipped;
    jp->sum.failed += st.failed;
}

int journal_replay_all(const struct imapconf *conf,
                       struct journal_replay_stats *st)
{
    struct jnl_parts jp;

    memset(&jp, 0, sizeof(jp));
    jp.conf = conf;
    imapconf_foreach(conf, jnl_replay_one, &jp);
    if (st)
        *st = jp.sum;
    return jp.first;
}
