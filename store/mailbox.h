/*
 * mailbox.h - one mailbox on disk: its spool directory, message files and
 * index.  The on-disk format and the crash argument are at the top of
 * mailbox.c; in short:
 *
 * DIRECTORY  mboxname_spool_dir(partition root, name, hashimapspool)
 *   UID.            one file per message, the message as received (CRLF)
 *   cyrus.header    text: magic line, "NAME<TAB>UNIQUEID", user flag names
 *                   (written to a temp file, synced, renamed, dir synced)
 *   cyrus.index     binary, all integers little-endian:
 *     [0,4096)      two header slots of 2048 bytes at 0 and 2048; the valid
 *                   slot (magic, version, CRC-32C) with the higher
 *                   generation counts; a header write goes to the other
 *                   slot, so a torn write never loses the header.
 *     [4096, ...)   records of 128 bytes, in increasing UID order.
 *
 * Header slot: magic "CDMBIDX1", version, generation, uidvalidity, uidnext,
 *   num_records (records in the file it accounts for), visible (records
 *   [0, visible) are resolved: committed, expunged or aborted; readers look
 *   at nothing beyond), exists (visible, not expunged/aborted), highest
 *   modseq, quota_used (bytes of the `exists` messages), last append date,
 *   dirty (bit 1: records of the visible prefix being changed in place,
 *   counters to be recomputed; bit 2: counters moved, quota not yet told),
 *   compactions, synced (records [0, synced) are known durable in their
 *   resolved state: recovery re-examines only [synced, end)), CRC-32C,
 *   deletedmodseq (see struct mailbox_header) with a CRC of its own.
 *   Exact byte offsets at the top of mailbox.c.
 * Record: uid, flags (system flags, and MAILBOX_FLAG_EXPUNGED / _PENDING /
 *   _ABORTED), internal date, size, header size, 128-bit user flag bitmap,
 *   modseq, last change time, SHA-1 content digest, CRC-32C.
 *
 * Locks (fcntl, on cyrus.index): the mailbox lock is byte 0 (shared for
 * readers, exclusive for writers); an appender also holds an exclusive
 * lock on its pending record's 128 bytes from reservation to finish, so a
 * writer can tell a live append (lock held) from a dead one (lock free).
 * fcntl locks belong to the process and vanish when any descriptor of the
 * file is closed, so a process has at most one open index descriptor per
 * mailbox: mailbox_open() of a mailbox this process already has open
 * returns the same handle with a reference count.
 *
 * Reads happen under the shared lock, changes under the exclusive lock.
 * Handles are per process: open after fork().
 */
#ifndef STORE_MAILBOX_H
#define STORE_MAILBOX_H

#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "lib/buf.h"
#include "lib/imapconf.h"
#include "store/commit.h"

#define MAILBOX_INDEX_FNAME "cyrus.index"
/* In configdirectory: the last uidvalidity given out (decimal text) */
#define MAILBOX_UIDVALIDITY_FNAME "mailboxes.uidvalidity"
#define MAILBOX_HEADER_FNAME "cyrus.header"
#define MAILBOX_DIGEST_LEN 20   /* SHA-1 */
#define MAILBOX_USER_FLAGS 128

/* System flags (IMAP) */
#define MAILBOX_FLAG_ANSWERED  (1u << 0)
#define MAILBOX_FLAG_FLAGGED   (1u << 1)
#define MAILBOX_FLAG_DELETED   (1u << 2)
#define MAILBOX_FLAG_DRAFT     (1u << 3)
#define MAILBOX_FLAG_SEEN      (1u << 4)
#define MAILBOX_SYSTEM_FLAGS   0x1fu
/* Internal states */
#define MAILBOX_FLAG_EXPUNGED  (1u << 16)  /* gone for IMAP; file removed by cleanup */
#define MAILBOX_FLAG_PENDING   (1u << 17)  /* reserved by an append in progress */
#define MAILBOX_FLAG_ABORTED   (1u << 18)  /* an append that never completed */

struct mailbox;   /* an open mailbox: opaque */

/* What the current header says (copied out under the lock). */
struct mailbox_header {
    uint32_t uidvalidity;
    uint32_t uidnext;
    uint32_t num_records;
    uint32_t visible;
    uint32_t exists;
    uint64_t highestmodseq;
    uint64_t quota_used;
    int64_t last_appenddate;
    uint32_t compactions;    /* bumped each time cleanup rewrote the index:
                                record numbers from before are stale */
    uint64_t deletedmodseq;  /* the highest modseq of an expunged record
                                that cleanup removed: expunges after it are
                                all still records (QRESYNC's VANISHED) */
};

struct mailbox_record {
    uint32_t uid;
    uint32_t flags;
    int64_t internaldate;
    uint32_t size;
    uint32_t header_size;
    uint32_t user_flags[MAILBOX_USER_FLAGS / 32];
    uint64_t modseq;
    int64_t last_updated;
    unsigned char digest[MAILBOX_DIGEST_LEN];
};

/* What an append knows about the message it stages (append.c fills it). */
struct mailbox_msginfo {
    uint32_t size;
    uint32_t header_size;            /* bytes up to and including the empty
                                        line ending the header */
    unsigned char digest[MAILBOX_DIGEST_LEN];
};

/* Create the spool directory, an empty cyrus.header and cyrus.index
 * (uidvalidity = `uidvalidity`, or when 0 a new one: the current time,
 * or one more than the last given out when that is not smaller; kept in
 * CONFIGDIR/mailboxes.uidvalidity, synced before the index is made, so
 * that it never repeats for a name; uidnext 1),
 * and sync the files and directories.  An existing directory holding no
 * index is reused (the orphan of an interrupted create or delete: message
 * files left in it are removed); one holding an index gives STORE_EXISTS.
 * uniqueid may be NULL (empty); one with control bytes, spaces or over
 * 256 bytes gives STORE_BADNAME.  STORE_OK, STORE_EXISTS, STORE_BADPARTITION,
 * STORE_BADNAME, STORE_IOERROR, STORE_NOSPACE. */
int mailbox_create(const struct imapconf *conf, const char *name,
                   const char *partition, const char *uniqueid,
                   uint32_t uidvalidity);

/* Remove the spool directory of a mailbox (index first, so that nobody
 * opens it any more, then the other files, then the directory;
 * subdirectories that are other mailboxes' spools are left alone, and
 * parent directories left empty below the partition root are removed).
 * A directory that does not exist is not an error.  The caller has
 * removed the list entry.  STORE_OK, STORE_IOERROR (also
 * STORE_BADPARTITION, STORE_BADNAME). */
int mailbox_delete_spool(const struct imapconf *conf, const char *name,
                         const char *partition);

/* The spool directory of a name on a partition, into out. */
int mailbox_spool_dir(const struct imapconf *conf, const char *name,
                      const char *partition, struct buf *out);

/* Open a mailbox (no lock taken).  STORE_NOTFOUND (no index),
 * STORE_BADPARTITION, STORE_CORRUPT (no valid header slot), STORE_IOERROR.
 * Same mailbox already open in this process: the same handle, reference
 * counted.  The handle borrows conf: it must outlive the handle. */
int mailbox_open(const struct imapconf *conf, const char *name,
                 const char *partition, struct mailbox **mb_r);
/* Drop a reference; the last one unlocks and closes. */
void mailbox_close(struct mailbox **mbp);

enum mailbox_locktype { MAILBOX_LOCK_SHARED = 1, MAILBOX_LOCK_EXCLUSIVE = 2 };

/* Take the mailbox lock (blocking) and read the header.  If cleanup
 * replaced the index since, the new file is opened first.  An exclusive
 * lock also runs recovery: appends whose owner died are verified (file
 * exists, size and digest match) and committed or aborted; a dirty header
 * is recomputed from the records; the visible prefix advanced.  Then, when
 * the mailbox has a quota root, the quota database is brought in line with
 * the header (quota.h).  A shared lock runs that recovery (exclusive lock
 * taken and released first) only when the record at the end of the
 * visible prefix is a dead appender's: appends finished behind it were
 * acknowledged and the reader sees them.  STORE_OK, STORE_CORRUPT,
 * STORE_IOERROR, STORE_NOTFOUND (the index was removed: mailbox deleted
 * meanwhile), STORE_INTERNAL (the handle is already locked: locks do not
 * nest). */
int mailbox_lock(struct mailbox *mb, enum mailbox_locktype type);

/* The shared lock without any recovery: for journal replay, which looks
 * at the index before it restores message files that recovery must
 * find.  Released with mailbox_unlock(). */
int mailbox_lock_peek(struct mailbox *mb);

/* The version of the index the last lock of this handle read: header
 * generation (every header write raises it), device and inode. */
struct mailbox_version {
    uint64_t generation;
    uint64_t dev;
    uint64_t ino;
};
void mailbox_version(const struct mailbox *mb, struct mailbox_version *v);

/* Without taking the lock: is the index still at version v (as
 * mailbox_version() gave it under an earlier lock)?  `st` is a stat() of
 * the index's path the caller took just before.  1 when the path still
 * names that file, the one this handle has open, and the current
 * header's generation (both slots read with one pread, the valid one
 * with the higher generation) is v's: nothing was committed since, and a
 * lock would find the same header.  0 otherwise (changed, or not known:
 * locked now, or a read error): lock and look. */
struct stat;
int mailbox_unchanged(struct mailbox *mb, const struct stat *st,
                      const struct mailbox_version *v);

/* Finish the changes made under an exclusive lock: write the header, make
 * the changes durable through a commit round (commit.h), update quota, and
 * release the lock.  Under a shared lock: release it.  STORE_OK, or the
 * sync's error (the lock is released in every case); STORE_INTERNAL when
 * not locked.  A lock that changed nothing runs no commit round.
 * A lock that changed only flags, keywords and modseqs of records
 * (mailbox_rewrite_record() without an expunge) runs no commit round
 * either, unless imapd.conf's spool_sync_flags is on: the header goes to
 * the page cache (every process sees it at once), and the changes become
 * durable with the mailbox's next sync of its index (an expunge, any
 * process; with spool_sync file or group also an append or delivery),
 * mailbox_flush() or the kernel's writeback.
 * A power loss before that may undo them, never a message, and leaves
 * the index consistent (mailbox.c, FLAG CHANGES). */
int mailbox_unlock(struct mailbox *mb);

/* Sync this process's unsynced flag changes of mb (one fdatasync of the
 * index; nothing when there are none).  mailbox_close() of the last
 * reference does it too.  Without a lock.  STORE_OK, STORE_IOERROR,
 * STORE_NOSPACE. */
int mailbox_flush(struct mailbox *mb);
/* 1 when this process left flag changes of mb unsynced (mailbox_flush()
 * would sync). */
int mailbox_unsynced(const struct mailbox *mb);

/* The header as of the last lock. */
const struct mailbox_header *mailbox_get_header(const struct mailbox *mb);
const char *mailbox_name(const struct mailbox *mb);
const char *mailbox_partition(const struct mailbox *mb);
const char *mailbox_uniqueid(const struct mailbox *mb);
const char *mailbox_dir(const struct mailbox *mb);

/* Read record recno (0-based, < num_records) under a lock.  STORE_OK,
 * STORE_NOTFOUND (recno out of range), STORE_CORRUPT (CRC mismatch),
 * STORE_IOERROR, STORE_INTERNAL (not locked).  A record of the visible
 * prefix never shows MAILBOX_FLAG_PENDING (it is committed by position;
 * a crash may have lost the write that cleared the bit). */
int mailbox_read_record(struct mailbox *mb, uint32_t recno,
                        struct mailbox_record *rec_r);

/* Binary search for uid among the visible records: STORE_OK and *recno_r,
 * or STORE_NOTFOUND. */
int mailbox_find_uid(struct mailbox *mb, uint32_t uid, uint32_t *recno_r);

/* Path of a message file "DIR/UID." into out. */
void mailbox_message_path(const struct mailbox *mb, uint32_t uid,
                          struct buf *out);
/* Open a message file read-only: STORE_OK and *fd_r, STORE_NOTFOUND,
 * STORE_IOERROR. */
int mailbox_open_message(const struct mailbox *mb, uint32_t uid, int *fd_r);

/* Under the exclusive lock: replace the flags (system flags and user
 * flags; internal bits of rec->flags are taken from the stored record,
 * except MAILBOX_FLAG_EXPUNGED, which may be set and never cleared) of
 * record recno.  The record gets modseq = ++highestmodseq and
 * last_updated = now; counters follow (expunge: exists - 1, quota_used -
 * size).  Durable at mailbox_unlock().  STORE_OK, STORE_NOTFOUND,
 * STORE_CORRUPT, STORE_IOERROR, STORE_INTERNAL (not exclusively locked,
 * or recno not visible); STORE_NOTFOUND also for an ABORTED record (no
 * message).  With spool_sync_flags on, the first change under a lock
 * makes the dirty bit durable (one fdatasync) before any record is
 * touched; with it off (the default) only the first change of the
 * mailbox since the system booted does (the boot stamp, mailbox.c). */
int mailbox_rewrite_record(struct mailbox *mb, uint32_t recno,
                           const struct mailbox_record *rec);

/* Under the exclusive lock, for a mailbox restored from another server
 * (mbtool userload): set uidvalidity (0: keep; another value only while
 * the index has no record, else STORE_EXISTS), raise uidnext and
 * highestmodseq to the given values when they are higher (never lower
 * them), and raise deletedmodseq with highestmodseq (expunges of the
 * original are not records here: QRESYNC reports them as a client's
 * known UIDs that are gone).  Messages appended afterwards get the next
 * UIDs from uidnext and modseqs above highestmodseq.  Durable at
 * mailbox_unlock().  STORE_OK, STORE_EXISTS, STORE_INTERNAL. */
int mailbox_restore_counters(struct mailbox *mb, uint32_t uidvalidity,
                             uint32_t uidnext, uint64_t highestmodseq);

/* User flag names (cyrus.header): the number of `name` (case-insensitive,
 * as IMAP keywords), creating it when `create` and the exclusive lock is
 * held.  STORE_OK and *num_r, STORE_NOTFOUND, STORE_OVERQUOTA when all 128
 * are in use, STORE_BADNAME (not an IMAP atom, starts with '\', or over
 * 100 bytes), STORE_INTERNAL (create of a new name without the exclusive
 * lock).  A new name is durable (cyrus.header rewritten and synced) when
 * this returns. */
int mailbox_user_flag(struct mailbox *mb, const char *name, int create,
                      int *num_r);
/* Name of user flag num, or NULL. */
const char *mailbox_user_flag_name(const struct mailbox *mb, int num);

/* Under the exclusive lock: remove the files of expunged and aborted
 * records and, when no append is pending, rewrite the index without them
 * (cyrus.index.NEW, synced, renamed over, directory synced; compactions
 * + 1).  Other processes' handles move to the new file at their next
 * lock.  STORE_OK, STORE_IOERROR, STORE_NOSPACE, STORE_CORRUPT,
 * STORE_INTERNAL (not exclusively locked). */
int mailbox_cleanup(struct mailbox *mb);

/* mailbox_cleanup() bounded, for scheduled upkeep (cyr_expire): takes
 * aborted records and expunged records whose last change (the expunge)
 * is not after expunged_before (seconds since the epoch; 0: any age), at
 * most max_files of them (0: no bound), and compacts the index without
 * exactly those.  Younger expunged records keep their files and records.
 * *removed_r (may be NULL) gets the number taken, *more_r (may be NULL) 1
 * when eligible records were left for another batch: the caller releases
 * the lock (deliveries and IMAP get in), and calls again; 2 when an append
 * in progress kept the index from being compacted: the batch's files are
 * gone, its records stay, and a later call (after the append) compacts.
 * Errors as mailbox_cleanup(), STORE_NOMEM. */
int mailbox_cleanup_batch(struct mailbox *mb, int64_t expunged_before,
                          uint32_t max_files, uint32_t *removed_r,
                          int *more_r);

/* ---- append (called by append.c; see the durability argument there) ---- */

/* Phase 1.  Takes and releases the exclusive lock itself: allocates
 * uid = uidnext, hard-links stage_path to DIR/UID. (copying when the link
 * crosses file systems), writes a PENDING record after the last one,
 * updates uidnext and num_records, keeps the lock on the record's bytes,
 * and adds the index descriptor and the directory to `batch`.  STORE_OK
 * and *uid_r, STORE_IOERROR, STORE_NOSPACE, STORE_CORRUPT, STORE_INTERNAL
 * (the handle is locked, or was opened by another process).  batch may be
 * NULL (the caller then syncs by other means). */
int mailbox_append_reserve(struct mailbox *mb, const char *stage_path,
                           const struct mailbox_msginfo *info,
                           int64_t internaldate, uint32_t sysflags,
                           struct commit_batch *batch, uint32_t *uid_r);

/* mailbox_append_reserve() with keywords: each name is defined in the
 * mailbox as needed (as mailbox_user_flag() with create, under the same
 * exclusive lock, cyrus.header synced) and its bit is in the PENDING
 * record, so the message becomes visible with its keywords in the one
 * commit.  A name that is not a valid atom, or beyond the mailbox's 128
 * keywords, is left out (logged) unless `strict`, when it fails the call
 * with STORE_BADNAME or STORE_OVERQUOTA and nothing is reserved (IMAP
 * APPEND, COPY, MOVE: the client is told, never answered OK without a
 * keyword); NULL entries are skipped.  Errors as
 * mailbox_append_reserve(), and the header file's (STORE_IOERROR, ...). */
int mailbox_append_reserve_keywords(struct mailbox *mb,
                                    const char *stage_path,
                                    const struct mailbox_msginfo *info,
                                    int64_t internaldate, uint32_t sysflags,
                                    const char *const *keywords,
                                    size_t nkeywords, int strict,
                                    struct commit_batch *batch,
                                    uint32_t *uid_r);

/* Phase 2, after the batch's sync round succeeded: under the exclusive
 * lock, marks the record committed, advances the visible prefix over every
 * resolved record, updates the counters and header, releases the record
 * lock, and tells quota (under the lock).  The message is then visible to
 * readers, or will be as soon as every older pending append of this
 * mailbox is resolved.  STORE_OK, STORE_IOERROR, STORE_NOTFOUND (uid is
 * not this process's pending append).  A record that reconstruct already
 * committed gives STORE_OK. */
int mailbox_append_finish(struct mailbox *mb, uint32_t uid);

/* mailbox_append_finish(mbs[i], uids[i]) for i = 0 .. n-1, with quota
 * told in ONE quota database transaction (quota_update_many) instead of
 * one per mailbox.  A mailbox may appear several times (one uid each).
 * The exclusive locks of the distinct mailboxes are all taken first, in
 * increasing order of their index paths (the global lock order, see the
 * top of mailbox.c), and held until quota is told: a delivery's finish
 * holds every recipient's lock at once for a short while.  A pair that
 * fails (its mailbox cannot be locked, or its record cannot be made
 * visible) does not stop the others, and the others' quota is still
 * told; a failed quota transaction leaves each mailbox's "quota not yet
 * told" bit for its next exclusive locker (usage is re-reported then).
 * results_r (may be NULL) gets each pair's code as mailbox_append_finish()
 * would return it (STORE_INTERNAL for a NULL handle, one of another
 * process, or one the caller has locked).  Returns STORE_OK, or the first
 * pair's error in the caller's order.  n == 0: STORE_OK. */
int mailbox_append_finish_many(struct mailbox **mbs, const uint32_t *uids,
                               size_t n, int *results_r);

/* Instead of finish (the sync failed, or the caller gives up): marks the
 * record ABORTED (synced), unlinks DIR/UID., releases the record lock.
 * The uid is never reused.  STORE_OK, STORE_NOTFOUND (not this process's
 * pending append), STORE_IOERROR.  mailbox_close() of the last reference
 * cancels the appends still pending on the handle. */
int mailbox_append_cancel(struct mailbox *mb, uint32_t uid);

/* ---- checks and repair ---- */

/* Verify everything under a shared lock: header CRC, each record's CRC,
 * UIDs increasing and < uidnext, counters equal to the records, modseqs
 * <= highestmodseq, every visible non-expunged message file present with
 * the recorded size; both header slots are checked, so a damaged older
 * slot (which open survives) is reported too.  Takes the shared lock
 * itself when the handle is not locked.  Counters are not compared while
 * the dirty bit says a recomputation is due; a PENDING flag inside the
 * visible prefix is accepted beyond `synced` (a lost write that the next
 * writer repairs).  STORE_OK, or STORE_CORRUPT with a one-line
 * description of the first problem in *problem (may be NULL). */
int mailbox_check(struct mailbox *mb, struct buf *problem);

/* Rebuild cyrus.index from the message files of the directory: each
 * "N." file becomes a record (size, header size and digest from the file,
 * internal date from its mtime); flags and modseq are kept from the old
 * index where its record for that uid is intact and the digest matches.
 * uidvalidity kept from a valid old header (else a new one, as
 * mailbox_create() gives), uidnext =
 * max(old uidnext, highest uid + 1).  The new index is written beside,
 * synced and renamed over.  Needs no open handle and takes the exclusive
 * lock on the old index when there is one.  Quota is recomputed for the
 * mailbox.  *report_r (may be NULL) gets a summary line ("N messages,
 * M records dropped, K files added").  STORE_OK, STORE_NOTFOUND (no spool
 * directory), STORE_IOERROR, STORE_INTERNAL (this process holds the
 * mailbox under a shared lock).  When this process has the mailbox open,
 * its handle is used (and moved to the new index); an append pending at
 * that moment whose file exists ends up committed.  cyrus.header is kept
 * when it parses (rewritten with `uniqueid` when that differs; uniqueid
 * NULL keeps the old one), else rewritten without user flags.
 * compactions + 1: record numbers from before are stale. */
int mailbox_reconstruct(const struct imapconf *conf, const char *name,
                        const char *partition, const char *uniqueid,
                        struct buf *report_r);

/* A message whose bytes are known from elsewhere (the delivery journal):
 * its uid, size and SHA-1. */
struct mailbox_known {
    uint32_t uid;
    uint32_t size;
    unsigned char digest[MAILBOX_DIGEST_LEN];
};

/* mailbox_reconstruct() after a power loss (journal replay), keeping the
 * uniqueid: a file becomes a record only when it is verified complete,
 * i.e. it has the size and digest of the old index's intact record for
 * its uid or of an entry of known[0 .. nknown) with its uid (any order).
 * Any other file is a torn or partial write of a delivery that was never
 * acknowledged (an acknowledged one has a durable record or a journal
 * entry): it is unlinked (logged), never shown.  Without a readable old
 * index header nothing can be verified and every file is taken, as by
 * mailbox_reconstruct() (logged).  Same results as mailbox_reconstruct(),
 * and STORE_NOMEM. */
int mailbox_reconstruct_verified(const struct imapconf *conf,
                                 const char *name, const char *partition,
                                 const struct mailbox_known *known,
                                 size_t nknown, struct buf *report_r);

#endif
