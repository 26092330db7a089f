/*
 * mailbox.c - one mailbox on disk: spool directory, message files, index
 * (mailbox.h is the interface).
 *
 * ON-DISK FORMAT
 *
 * DIR = mboxname_spool_dir(partition root, name, hashimapspool).
 *   DIR/UID.        one message, as received; a hard link to the staging
 *                   file (a synced copy when the stage is on another file
 *                   system).
 *   cyrus.header    "cyrusdeliver mailbox header 1\n" "NAME\tUNIQUEID\n"
 *                   and the user flag names separated by spaces (position =
 *                   bit number).  Replaced whole: temp file, fsync, rename,
 *                   fsync(DIR).
 *   cyrus.index     all integers little-endian, written through explicit
 *                   byte helpers:
 *     [0, 4096)     two header slots, at 0 and at 2048.  Slot:
 *                     0 magic "CDMBIDX1"   8 version (1)   12 generation u64
 *                    20 uidvalidity  24 uidnext  28 num_records  32 visible
 *                    36 exists  40 highestmodseq u64  48 quota_used u64
 *                    56 last_appenddate i64  64 dirty  68 compactions
 *                    72 synced  76 CRC-32C of bytes [0, 76)
 *                    80 deletedmodseq u64  88 CRC-32C of bytes [0, 88)
 *                    92 boot u64  100 CRC-32C of bytes [0, 100)
 *                   (a slot whose second CRC fails predates deletedmodseq:
 *                   it reads as 0, or highestmodseq once compacted; one
 *                   whose third CRC fails predates boot: it reads as 0).
 *                   The valid slot (magic, version, CRC) with the higher
 *                   generation is current; a header write puts generation+1
 *                   into the OTHER slot, so a torn write leaves the previous
 *                   header intact.
 *     [4096, ...)   records of 128 bytes, UIDs increasing:
 *                     0 uid  4 flags  8 internaldate i64  16 size
 *                    20 header_size  24 user flags (4 x u32)  40 modseq u64
 *                    48 last_updated i64  56 SHA-1 (20)  76..123 zero
 *                   124 CRC-32C of bytes [0, 124).
 *                   Each record is written with one pwrite at a 128-aligned
 *                   offset: it never straddles a sector, so it is assumed
 *                   to reach the disk whole or not at all once written in
 *                   place (a torn append at the end of file is handled).
 *
 * Header fields beyond mailbox_header: `dirty` bit 1 (MBX_DIRTY_RECORDS):
 * records of the visible prefix are being changed in place; bit 2
 * (MBX_DIRTY_QUOTA): the counters moved and the quota database may not
 * know yet.  `synced`: records [0, synced) are known to be on disk in
 * their resolved state (a sync of the index happened after they were
 * written); recovery re-examines [synced, end of file) only.  `boot`:
 * flag changes may have been left unsynced during that boot of the
 * system (FLAG CHANGES), 0: none since the last recomputation.
 *
 * Records [0, visible) are resolved: committed, expunged or aborted.
 * Records [visible, num_records) are pending appends or appends resolved
 * behind an older pending one.  `visible` advances over a consecutive
 * resolved run; each message entering it gets modseq = ++highestmodseq and
 * enters exists and quota_used, so readers see appends in uid order and
 * never a gap that fills later.
 *
 * LOCKS AND HANDLES
 *
 * fcntl locks on cyrus.index: byte 0 is the mailbox lock (F_RDLCK for
 * readers, F_WRLCK for writers); an appender holds F_WRLCK on its pending
 * record's 128 bytes from reservation to finish/cancel, so that another
 * process can tell a live append (lock held, F_GETLK) from a dead one.
 * fcntl locks belong to the process and are all lost when any descriptor
 * of the file is closed: a per-process registry keyed by index path hands
 * out one reference-counted handle per mailbox.  After taking the mailbox
 * lock the descriptor's inode is compared with the path's: when cleanup or
 * reconstruct renamed a new index in place the handle moves to it.
 * Cleanup compacts only while no record is pending, so no process ever
 * has a record lock in a file that is replaced under it (reconstruct, a
 * repair, may: an append it catches ends committed, see below).
 *
 * LOCK ORDER (deadlock freedom).  Every path holds at most one mailbox
 * lock, except mailbox_append_finish_many(), which takes the exclusive
 * locks of its distinct mailboxes in increasing strcmp() order of their
 * index paths and holds them all until it is done; another such call
 * follows the same order, so no cycle of waiting processes can form
 * among mailbox locks.  Record locks are only ever taken and tested
 * without waiting (F_SETLK, F_GETLK).  The quota database's lock (a
 * cyrusdb transaction on quotas.db, quota.c) is taken while holding
 * mailbox locks (quota pushes) or holding none (quota_check() in
 * append_add(), mbtool's quota commands), and quota.c never takes a
 * mailbox lock: nothing waits for a mailbox lock while holding the quota
 * database, so order mailbox locks -> quota lock has no reverse edge.
 * A commit round (run under a mailbox lock by mailbox_unlock()) waits for
 * no mailbox lock either; group commit must keep it so.
 *
 * THE APPEND PATH (the durability argument of the whole append is at the
 * top of commit.c; this is the index's side of it)
 *
 *  R  reserve, under the exclusive lock: recovery; uid = uidnext;
 *     link(stage, DIR/UID.) (a stale DIR/UID. left by a reservation whose
 *     record never reached the disk is replaced); record lock; PENDING
 *     record written at 4096 + num_records * 128; header: num_records+1,
 *     uidnext+1; index fd and DIR added to the caller's batch; lock
 *     released.  Nothing synced.
 *  C  the caller's sync round: file, index, DIR.
 *  F  finish, under the exclusive lock: PENDING cleared in place; visible
 *     advanced (modseq, exists, quota_used); `synced` raised to the
 *     visible value seen at R (everything resolved before R was written
 *     before R, and C synced the whole file; with spool_sync: journal C
 *     synced the journal instead, and `synced` is raised to visible only
 *     after an fdatasync() of the index, done once visible is
 *     MBX_JOURNAL_SYNC_GAP records past it); header written; record lock
 *     released; quota told (under the lock, so two processes never report
 *     out of order; then bit 2 cleared).  Not synced: everything the
 *     header describes is already durable (the record, its file and the
 *     directory entry, by C); a lost header write or a lost record
 *     rewrite is redone by recovery, as below.
 *     mailbox_append_finish_many() does F for all of a message's
 *     recipients at once: every mailbox locked (LOCK ORDER), every uid
 *     finished and each header written with bit 2 set, then ONE quota
 *     transaction (quota_update_many) for all mailboxes with bit 2, then
 *     bit 2 cleared in each header, then all locks released.  Quota is
 *     still told under the lock of every mailbox it reports, and a crash
 *     or failure before the clearing leaves bit 2 for the next locker,
 *     exactly as for one mailbox.
 *  X  cancel: record marked ABORTED and fdatasync'ed (so that a later
 *     header, once it counts the record as resolved, can never meet it as
 *     PENDING and take it for committed), file unlinked, record lock
 *     released, visible advanced.
 *
 * FLAG CHANGES (spool_sync_flags: no, the default)
 *
 * A lock that changed only flags, keywords and modseqs of visible records
 * (mailbox_rewrite_record() without an expunge) ends without a sync: the
 * records and the header go to the page cache, where every process sees
 * them at once.  They reach the disk with the mailbox's next sync of its
 * index (an expunge; with spool_sync file or group also an append or a
 * delivery, whose round syncs the whole index file; with journal an
 * append syncs the journal, and the index only every
 * MBX_JOURNAL_SYNC_GAP records), with mailbox_flush() (imapd: a second
 * after the session's last command, and at close and LOGOUT, after the
 * reply), or by the kernel's writeback.  An expunge is still synced at its unlock (exists and quota
 * move with it, and cleanup unlinks a file only once its EXPUNGED record
 * is durable, below), as is every append.
 *   Against a killed process nothing changes: the page cache keeps every
 * write in the order made, and dirty bit 1 is written (not synced) before
 * the first record changes, cleared by the header written at the unlock.
 *   Against a power loss: any subset of the unsynced writes may be on
 * disk.  Each 128-byte record lies in one sector and each slot (104
 * bytes at 0 and 2048) too, so each is whole old or whole new (the
 * assumption made for records everywhere here).  Flag changes never move
 * num_records, visible, uidnext or synced, so whichever header wins
 * still describes the records, except for what flag changes move:
 * highestmodseq (a record may carry a modseq above it) and, for an older
 * header, the dirty bits.  So before the first unsynced change of a
 * boot, the header gets `boot` = this boot's stamp and is synced (one
 * fdatasync per mailbox and boot); every later header carries it (the
 * slot is copied), and the synced slot can only be overwritten by later
 * headers that carry it too.  The first exclusive locker of a later boot
 * finds `boot` set and not its own: recovery step d recomputes exists,
 * quota_used and highestmodseq from the records and clears `boot`.  What
 * is lost: flag changes of the last moments before the power failed, each
 * record's change whole or not at all; never a message, an append or an
 * expunge that was acknowledged.  Without a readable boot id (nor boot
 * time) every change is synced as with spool_sync_flags: yes.
 *
 * RECOVERY (every exclusive lock, before anything else)
 *
 *  a. records in the file = (size - 4096) / 128; a partial trailing
 *     record is cut off; in [synced, end) the first record failing its CRC
 *     and everything after it is cut off (never synced: a sync round
 *     would have made it whole) unless an intact record follows it
 *     (STORE_CORRUPT: needs reconstruct), or it lies in [0, visible)
 *     (STORE_CORRUPT).  num_records becomes the count of intact records;
 *     uidnext is raised above the last uid; when records were lost, their
 *     uids' stale files are unlinked.
 *  b. a PENDING record in [synced, visible) was committed and the write
 *     that cleared PENDING was lost (the header reached the disk, the
 *     record's page did not): PENDING is cleared, a missing modseq given.
 *     It cannot be an aborted one: X syncs ABORTED before visible moves.
 *  c. a PENDING record at or beyond visible, not this process's own, whose
 *     record lock nobody holds, belongs to a dead appender: DIR/UID. is
 *     read back (size and SHA-1); complete -> committed, after fsync of
 *     the file, DIR and the index (it becomes visible only once durable);
 *     else ABORTED (synced) and the file unlinked.
 *  d. dirty bit 1, or `boot` set by an earlier boot (FLAG CHANGES):
 *     recompute exists, quota_used, highestmodseq from the records of
 *     the visible prefix.
 *  e. visible advanced over resolved records; header written if anything
 *     changed; with bit 2 set, quota is told.
 * A shared lock recovers nothing, except that a reader who finds the
 * record at `visible` to be a dead appender's (PENDING, not its own,
 * record lock free) takes the exclusive lock once to run this recovery,
 * then its shared lock again: appends finished behind a worker killed
 * between its R and F were acknowledged, and a reader sees them without
 * waiting for the next append to the mailbox.
 *
 * CRASH POINTS (crash = process killed, or power lost with any subset of
 * the unsynced writes on disk).  What the next exclusive locker sees:
 *  - during create: the index is linked into place (link(2), atomic)
 *    after cyrus.header was renamed and synced; a directory without index
 *    is reused by the next create.
 *  - during R, before C completes: any subset of {DIR/UID., record,
 *    header}.  Header without record: the count is corrected (a).  Record
 *    without header: found beyond num_records, treated like a pending one
 *    (c).  Record without complete file: aborted (c).  Torn record at the
 *    end: cut off (a).  None of it was acknowledged.
 *  - after C, before or during F: record PENDING and durable, file and
 *    entry durable: (c) commits it, or, if F's header reached the disk
 *    without the record rewrite, (b) does.  Nothing acknowledged is lost.
 *  - during X: ABORTED durable or not; if not, the record is still PENDING
 *    and (c) decides from the file (unlinked or not yet): either way a
 *    message that was never acknowledged, at worst delivered.
 *  - during a flag change (mailbox_rewrite_record): with
 *    spool_sync_flags: yes dirty bit 1 was made durable before the first
 *    record changed; the locker recomputes the counters (d).
 *    mailbox_unlock() writes the header, runs a commit round, and only
 *    then clears bit 1 (a lost clearing costs a recomputation).  Each
 *    record is whole old or whole new.  With it off, see FLAG CHANGES:
 *    bit 1 guards against a killed writer, `boot` against a power loss;
 *    an expunge is synced at the unlock as before.
 *  - during cleanup: files of expunged/aborted records are unlinked only
 *    after their records are durable; the compacted index is complete and
 *    synced as cyrus.index.NEW before rename(2) replaces the old one, and
 *    DIR is synced after: the old or the new index, both consistent.
 *  - between an index change and the quota update: bit 2 stays set in the
 *    header and the next locker tells quota (quota updates are absolute,
 *    so a repeated one is harmless).
 *  - during reconstruct: the new index is written beside, synced and
 *    renamed over: the old or the new one.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "lib/buf.h"
#include "lib/crc32c.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "lib/procid.h"
#include "store/idlenotify.h"
#include "store/journal.h"
#include "store/mailbox.h"
#include "store/mboxname.h"
#include "store/quota.h"
#include "store/store.h"

#define MBX_DIR_MODE 0750
#define MBX_FILE_MODE 0600
#define MBX_HEADER_MAGIC_LINE "cyrusdeliver mailbox header 1"
#define MBX_IDX_MAGIC "CDMBIDX1"
#define MBX_IDX_VERSION 1u
#define MBX_HDR_AREA 4096
#define MBX_SLOT_SIZE 2048
#define MBX_SLOT_LEN 104         /* bytes of a slot in use, CRCs included */
#define MBX_REC_SIZE 128
#define MBX_JOURNAL_SYNC_GAP 128 /* spool_sync: journal: records past
                                  * `synced` before the index is synced */

static int mbx_errno(int e)
{
    return (e == ENOSPC || e == EDQUOT) ? STORE_NOSPACE : STORE_IOERROR;
}

/* ---------------------------------------------------------------------- */
/* little-endian helpers                                                  */

static void mbx_put32(unsigned char *p, uint32_t v)
{
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void mbx_put64(unsigned char *p, uint64_t v)
{
    mbx_put32(p, (uint32_t)v);
    mbx_put32(p + 4, (uint32_t)(v >> 32));
}

/* ---------------------------------------------------------------------- */
/* spool directory                                                        */

/* The partition root and spool directory of name; *part_r gets the
 * partition name actually used (owned by conf or the caller). */
static int mbx_resolve(const struct imapconf *conf, const char *name,
                       const char *partition, const char **part_r,
                       const char **root_r, struct buf *out)
{
    const char *root;
    int r;

    if (!conf || !name)
        return STORE_INTERNAL;
    if (!partition || !*partition)
        partition = imapconf_getstring(conf, "defaultpartition");
    if (!partition || !*partition)
        return STORE_BADPARTITION;
    root = imapconf_partition(conf, partition);
    if (!root || !*root)
        return STORE_BADPARTITION;
    r = mboxname_spool_dir(root, name, imapconf_getswitch(conf,
                                                          "hashimapspool"),
                           out);
    if (r)
        return r;
    if (part_r)
        *part_r = partition;
    if (root_r)
        *root_r = root;
    return STORE_OK;
}

int mailbox_spool_dir(const struct imapconf *conf, const char *name,
                      const char *partition, struct buf *out)
{
    return mbx_resolve(conf, name, partition, NULL, NULL, out);
}

/* Is `fname` a message file name "N." (N decimal, no leading zero, fits
 * 32 bits, not 0)?  The uid into *uid_r. */
static int mbx_parse_msgname(const char *fname, uint32_t *uid_r)
{
    uint64_t v = 0;
    size_t i;

    if (fname[0] < '1' || fname[0] > '9')
        return 0;
    for (i = 0; fname[i] >= '0' && fname[i] <= '9'; i++) {
        if (i >= 10)
            return 0;
        v = v * 10 + (uint64_t)(fname[i] - '0');
    }
    if (fname[i] != '.' || fname[i + 1] != '\0' || v > UINT32_MAX)
        return 0;
    *uid_r = (uint32_t)v;
    return 1;
}

/* fsync `dir` and every directory above it up to and including `root`
 * (a create may have made all of them). */
static int mbx_sync_dirs_up(const char *dir, const char *root)
{
    struct buf p = BUF_INITIALIZER;
    size_t rootlen = strlen(root);
    int r = STORE_OK;

    while (rootlen > 1 && root[rootlen - 1] == '/')
        rootlen--;
    if (buf_setcstr(&p, dir) < 0)
        return STORE_NOMEM;
    for (;;) {
        char *slash;

        if (fs_fsync_dir(buf_cstring(&p)) < 0) {
            log_error("mailbox: fsync failed dir=<%s> error=<%s>",
                      buf_cstring(&p), strerror(errno));
            r = mbx_errno(errno);
            break;
        }
        if (p.len <= rootlen)
            break;
        slash = strrchr(buf_cstring(&p), '/');
        if (!slash || slash == p.s)
            break;
        buf_truncate(&p, (size_t)(slash - p.s));
        if (p.len < rootlen)
            break;
    }
    buf_free(&p);
    return r;
}

/* Write a whole file at `path` through `path`.tmp: write, fsync, rename.
 * The caller syncs the directory. */
static int mbx_write_file_atomic(const char *path, const void *data,
                                 size_t len)
{
    struct buf tmp = BUF_INITIALIZER;
    int fd, r = STORE_OK, e;

    if (buf_printf(&tmp, "%s.tmp.%ld", path, (long)getpid()) < 0)
        return STORE_NOMEM;
    fd = open(buf_cstring(&tmp), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
              MBX_FILE_MODE);
    if (fd < 0) {
        e = errno;
        log_error("mailbox: create failed file=<%s> error=<%s>",
                  buf_cstring(&tmp), strerror(e));
        buf_free(&tmp);
        return mbx_errno(e);
    }
    if (fs_write_all(fd, data, len) < 0 || fsync(fd) < 0) {
        e = errno;
        log_error("mailbox: write failed file=<%s> error=<%s>",
                  buf_cstring(&tmp), strerror(e));
        r = mbx_errno(e);
    }
    if (close(fd) < 0 && r == STORE_OK)
        r = mbx_errno(errno);
    if (r == STORE_OK && rename(buf_cstring(&tmp), path) < 0) {
        e = errno;
        log_error("mailbox: rename failed file=<%s> error=<%s>", path,
                  strerror(e));
        r = mbx_errno(e);
    }
    if (r)
        unlink(buf_cstring(&tmp));
    buf_free(&tmp);
    return r;
}

/* One header slot, decoded. */
struct mbx_slot {
    uint64_t generation;
    uint32_t uidvalidity, uidnext, num_records, visible, exists;
    uint64_t highestmodseq, quota_used;
    int64_t last_appenddate;
    uint32_t dirty, compactions;
    uint32_t synced;
    uint64_t deletedmodseq;   /* highest modseq of a record compacted away */
    uint64_t boot;            /* unsynced in-place changes were allowed
                               * during this boot (mbx_boot_stamp()), 0 =
                               * never since the last recomputation */
};

static void mbx_slot_encode(const struct mbx_slot *s, unsigned char *p)
{
    memset(p, 0, MBX_SLOT_LEN);
    memcpy(p, MBX_IDX_MAGIC, 8);
    mbx_put32(p + 8, MBX_IDX_VERSION);
    mbx_put64(p + 12, s->generation);
    mbx_put32(p + 20, s->uidvalidity);
    mbx_put32(p + 24, s->uidnext);
    mbx_put32(p + 28, s->num_records);
    mbx_put32(p + 32, s->visible);
    mbx_put32(p + 36, s->exists);
    mbx_put64(p + 40, s->highestmodseq);
    mbx_put64(p + 48, s->quota_used);
    mbx_put64(p + 56, (uint64_t)s->last_appenddate);
    mbx_put32(p + 64, s->dirty);
    mbx_put32(p + 68, s->compactions);
    mbx_put32(p + 72, s->synced);
    mbx_put32(p + 76, crc32c(p, 76));
    mbx_put64(p + 80, s->deletedmodseq);
    mbx_put32(p + 88, crc32c(p, 88));
    mbx_put64(p + 92, s->boot);
    mbx_put32(p + 100, crc32c(p, 100));
}

/* The text of cyrus.header. */
static int mbx_header_text(const char *name, const char *uniqueid,
                           char *const *flags, struct buf *out)
{
    int i;

    buf_reset(out);
    buf_printf(out, "%s\n%s\t%s\n", MBX_HEADER_MAGIC_LINE, name,
               uniqueid ? uniqueid : "");
    for (i = 0; flags && i < MAILBOX_USER_FLAGS && flags[i]; i++)
        buf_printf(out, "%s%s", i ? " " : "", flags[i]);
    if (buf_putc(out, '\n') < 0)
        return STORE_NOMEM;
    return STORE_OK;
}

/* A uniqueid goes on a tab-separated line: printable, no tab. */
static int mbx_uniqueid_ok(const char *u)
{
    size_t i;

    if (!u)
        return 1;
    for (i = 0; u[i]; i++) {
        if ((unsigned char)u[i] < 0x21 || (unsigned char)u[i] > 0x7e)
            return 0;
        if (i > 255)
            return 0;
    }
    return 1;
}

/* Remove the message files left in a directory reused by create (the
 * orphan of an interrupted delete): no index refers to them. */
static int mbx_remove_stale_messages(const char *dir)
{
    struct buf path = BUF_INITIALIZER;
    DIR *d;
    struct dirent *de;
    uint32_t uid;
    int r = STORE_OK;

    d = opendir(dir);
    if (!d)
        return mbx_errno(errno);
    while ((de = readdir(d)) != NULL) {
        if (!mbx_parse_msgname(de->d_name, &uid))
            continue;
        buf_reset(&path);
        buf_printf(&path, "%s/%s", dir, de->d_name);
        if (unlink(buf_cstring(&path)) < 0 && errno != ENOENT) {
            log_error("mailbox: unlink failed file=<%s> error=<%s>",
                      buf_cstring(&path), strerror(errno));
            r = STORE_IOERROR;
        }
    }
    closedir(d);
    buf_free(&path);
    return r;
}

/* A new uidvalidity: max(now, last + 1), where last is the one given
 * out before by any process of this configuration.  It is kept in
 * CONFIGDIR/MAILBOX_UIDVALIDITY_FNAME, read, raised and written back
 * (synced) under an exclusive fcntl lock, so that a name deleted and
 * created again, even within one second or after a restart, never gets a
 * uidvalidity it had before (RFC 3501 2.3.1.1).  Without configdirectory
 * (tools on a bare spool) only this process's last value is known. */
static int mbx_next_uidvalidity(const struct imapconf *conf, uint32_t *uv_r)
{
    static uint32_t proc_last;
    const char *confdir = imapconf_getstring(conf, "configdirectory");
    struct buf path = BUF_INITIALIZER;
    char text[32];
    uint32_t last = proc_last, uv;
    ssize_t n;
    int fd = -1, r = STORE_OK, e;

    if (confdir && *confdir) {
        buf_printf(&path, "%s/%s", confdir, MAILBOX_UIDVALIDITY_FNAME);
        fd = open(buf_cstring(&path), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
        if (fd < 0 || fs_lock(fd, F_WRLCK, 1) < 0) {
            e = errno;
            log_error("mailbox: uidvalidity counter failed file=<%s> "
                      "error=<%s>", buf_cstring(&path), strerror(e));
            r = mbx_errno(e);
            goto out;
        }
        n = pread(fd, text, sizeof(text) - 1, 0);
        if (n > 0) {
            unsigned long v;

            text[n] = '\0';
            v = strtoul(text, NULL, 10);
            if (v <= UINT32_MAX && (uint32_t)v > last)
                last = (uint32_t)v;
        }
    }
    uv = (uint32_t)time(NULL);
    if (uv <= last)
        uv = last + 1;
    if (uv == 0)
        uv = 1;                 /* wrapped: 0 means "none" */
    if (fd >= 0) {
        int len = snprintf(text, sizeof(text), "%u\n", (unsigned)uv);

        if (ftruncate(fd, 0) < 0
            || fs_pwrite_all(fd, text, (size_t)len, 0) < 0
            || fsync(fd) < 0) {
            e = errno;
            log_error("mailbox: uidvalidity counter write failed file=<%s> "
                      "error=<%s>", buf_cstring(&path), strerror(e));
            r = mbx_errno(e);
            goto out;
        }
    }
    proc_last = uv;
    *uv_r = uv;
out:
    if (fd >= 0)
        close(fd);              /* releases the lock */
    buf_free(&path);
    return r;
}

int mailbox_create(const struct imapconf *conf, const char *name,
                   const char *partition, const char *uniqueid,
                   uint32_t uidvalidity)
{
    struct buf dir = BUF_INITIALIZER, ipath = BUF_INITIALIZER;
    struct buf hpath = BUF_INITIALIZER, tmp = BUF_INITIALIZER;
    struct buf text = BUF_INITIALIZER;
    unsigned char area[MBX_HDR_AREA];
    struct mbx_slot s;
    struct stat sb;
    const char *root = NULL;
    int r, fd = -1, e, tries;

    r = mbx_resolve(conf, name, partition, &partition, &root, &dir);
    if (r)
        goto out;
    if (!mbx_uniqueid_ok(uniqueid)) {
        r = STORE_BADNAME;
        goto out;
    }
    buf_printf(&ipath, "%s/%s", buf_cstring(&dir), MAILBOX_INDEX_FNAME);
    buf_printf(&hpath, "%s/%s", buf_cstring(&dir), MAILBOX_HEADER_FNAME);
    buf_printf(&tmp, "%s.create.%ld", buf_cstring(&ipath), (long)getpid());

    /* mkdir -p; a concurrent delete of an empty parent may remove a
     * directory we just made: try again */
    for (tries = 0;; tries++) {
        if (fs_mkdir_p(buf_cstring(&dir), MBX_DIR_MODE) == 0)
            break;
        e = errno;
        if (e != ENOENT || tries >= 3) {
            log_error("mailbox: mkdir failed dir=<%s> error=<%s>",
                      buf_cstring(&dir), strerror(e));
            r = mbx_errno(e);
            goto out;
        }
    }
    if (stat(buf_cstring(&ipath), &sb) == 0) {
        r = STORE_EXISTS;
        goto out;
    }
    r = mbx_remove_stale_messages(buf_cstring(&dir));
    if (r)
        goto out;

    /* cyrus.header first: an index never exists without it */
    r = mbx_header_text(name, uniqueid, NULL, &text);
    if (r)
        goto out;
    r = mbx_write_file_atomic(buf_cstring(&hpath), text.s, text.len);
    if (r)
        goto out;
    if (fs_fsync_dir(buf_cstring(&dir)) < 0) {
        r = mbx_errno(errno);
        goto out;
    }

    /* the index: both slots valid, generation 1 current */
    memset(area, 0, sizeof(area));
    memset(&s, 0, sizeof(s));
    if (uidvalidity == 0) {
        r = mbx_next_uidvalidity(conf, &uidvalidity);
        if (r)
            goto out;
    }
    s.uidvalidity = uidvalidity;
    s.uidnext = 1;
    s.generation = 0;
    mbx_slot_encode(&s, area + MBX_SLOT_SIZE);
    s.generation = 1;
    mbx_slot_encode(&s, area);
    fd = open(buf_cstring(&tmp), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC,
              MBX_FILE_MODE);
    if (fd < 0) {
        e = errno;
        log_error("mailbox: create failed file=<%s> error=<%s>",
                  buf_cstring(&tmp), strerror(e));
        r = mbx_errno(e);
        goto out;
    }
    if (fs_write_all(fd, area, sizeof(area)) < 0 || fsync(fd) < 0) {
        e = errno;
        log_error("mailbox: write failed file=<%s> error=<%s>",
                  buf_cstring(&tmp), strerror(e));
        r = mbx_errno(e);
        goto out_unlink;
    }
    /* link(): exactly one concurrent create wins */
    if (link(buf_cstring(&tmp), buf_cstring(&ipath)) < 0) {
        e = errno;
        if (e == EEXIST) {
            r = STORE_EXISTS;
        } else {
            log_error("mailbox: link failed file=<%s> error=<%s>",
                      buf_cstring(&ipath), strerror(e));
            r = mbx_errno(e);
        }
        goto out_unlink;
    }
    unlink(buf_cstring(&tmp));
    r = mbx_sync_dirs_up(buf_cstring(&dir), root);
    if (r == STORE_OK)
        log_info("mailbox: created mailbox=<%s> partition=<%s>", name,
                 partition);
    goto out;

out_unlink:
    unlink(buf_cstring(&tmp));
out:
    if (fd >= 0)
        close(fd);
    buf_free(&dir);
    buf_free(&ipath);
    buf_free(&hpath);
    buf_free(&tmp);
    buf_free(&text);
    return r;
}

int mailbox_delete_spool(const struct imapconf *conf, const char *name,
                         const char *partition)
{
    struct buf dir = BUF_INITIALIZER, path = BUF_INITIALIZER;
    const char *root = NULL;
    DIR *d;
    struct dirent *de;
    struct stat sb;
    int r;

    r = mbx_resolve(conf, name, partition, &partition, &root, &dir);
    if (r)
        goto out;
    /* the index first: from then on nobody opens the mailbox */
    buf_printf(&path, "%s/%s", buf_cstring(&dir), MAILBOX_INDEX_FNAME);
    if (unlink(buf_cstring(&path)) < 0 && errno != ENOENT) {
        log_error("mailbox: unlink failed file=<%s> error=<%s>",
                  buf_cstring(&path), strerror(errno));
        r = STORE_IOERROR;
        goto out;
    }
    d = opendir(buf_cstring(&dir));
    if (!d) {
        if (errno != ENOENT) {
            log_error("mailbox: opendir failed dir=<%s> error=<%s>",
                      buf_cstring(&dir), strerror(errno));
            r = STORE_IOERROR;
        }
        goto out;
    }
    while ((de = readdir(d)) != NULL) {
        if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
            continue;
        buf_reset(&path);
        buf_printf(&path, "%s/%s", buf_cstring(&dir), de->d_name);
        if (lstat(buf_cstring(&path), &sb) < 0 || S_ISDIR(sb.st_mode))
            continue;   /* another mailbox's spool below this one */
        if (unlink(buf_cstring(&path)) < 0 && errno != ENOENT) {
            log_error("mailbox: unlink failed file=<%s> error=<%s>",
                      buf_cstring(&path), strerror(errno));
            r = STORE_IOERROR;
        }
    }
    closedir(d);
    if (r)
        goto out;
    if (rmdir(buf_cstring(&dir)) < 0 && errno != ENOTEMPTY &&
        errno != EEXIST && errno != ENOENT) {
        log_error("mailbox: rmdir failed dir=<%s> error=<%s>",
                  buf_cstring(&dir), strerror(errno));
        r = STORE_IOERROR;
        goto out;
    }
    /* empty parents below the partition root go too (they belonged to
     * no mailbox: a mailbox directory always holds cyrus.header) */
    {
        size_t rootlen = strlen(root);
        char *slash;

        while (rootlen > 1 && root[rootlen - 1] == '/')
            rootlen--;
        buf_setcstr(&path, buf_cstring(&dir));
        for (;;) {
            slash = strrchr(buf_cstring(&path), '/');
            if (!slash)
                break;
            buf_truncate(&path, (size_t)(slash - path.s));
            if (path.len <= rootlen)
                break;
            if (rmdir(buf_cstring(&path)) < 0)
                break;
        }
        if (path.len >= rootlen &&
            fs_fsync_dir(path.len > rootlen ? buf_cstring(&path) : root) < 0) {
            r = mbx_errno(errno);
            goto out;
        }
    }
    log_info("mailbox: deleted spool mailbox=<%s> partition=<%s>", name,
             partition);

out:
    buf_free(&dir);
    buf_free(&path);
    return r;
}


/* ---------------------------------------------------------------------- */
/* encoding                                                               */

static uint32_t mbx_get32(const unsigned char *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) |
           ((uint32_t)p[3] << 24);
}

static uint64_t mbx_get64(const unsigned char *p)
{
    return (uint64_t)mbx_get32(p) | ((uint64_t)mbx_get32(p + 4) << 32);
}

/* 0 and *s, or -1 when the slot fails magic, version or CRC. */
static int mbx_slot_decode(const unsigned char *p, struct mbx_slot *s)
{
    if (memcmp(p, MBX_IDX_MAGIC, 8) != 0 ||
        mbx_get32(p + 8) != MBX_IDX_VERSION ||
        mbx_get32(p + 76) != crc32c(p, 76))
        return -1;
    s->generation = mbx_get64(p + 12);
    s->uidvalidity = mbx_get32(p + 20);
    s->uidnext = mbx_get32(p + 24);
    s->num_records = mbx_get32(p + 28);
    s->visible = mbx_get32(p + 32);
    s->exists = mbx_get32(p + 36);
    s->highestmodseq = mbx_get64(p + 40);
    s->quota_used = mbx_get64(p + 48);
    s->last_appenddate = (int64_t)mbx_get64(p + 56);
    s->dirty = mbx_get32(p + 64);
    s->compactions = mbx_get32(p + 68);
    s->synced = mbx_get32(p + 72);
    /* the extension (deletedmodseq) has its own CRC: a slot written before
     * it existed has none, and then any compaction may have dropped
     * expunged records of any modseq up to the highest */
    if (mbx_get32(p + 88) == crc32c(p, 88))
        s->deletedmodseq = mbx_get64(p + 80);
    else
        s->deletedmodseq = s->compactions ? s->highestmodseq : 0;
    /* the second extension (boot) likewise: none in an older slot */
    s->boot = mbx_get32(p + 100) == crc32c(p, 100) ? mbx_get64(p + 92) : 0;
    return 0;
}

static void mbx_rec_encode(const struct mailbox_record *rec, unsigned char *p)
{
    int i;

    memset(p, 0, MBX_REC_SIZE);
    mbx_put32(p, rec->uid);
    mbx_put32(p + 4, rec->flags);
    mbx_put64(p + 8, (uint64_t)rec->internaldate);
    mbx_put32(p + 16, rec->size);
    mbx_put32(p + 20, rec->header_size);
    for (i = 0; i < MAILBOX_USER_FLAGS / 32; i++)
        mbx_put32(p + 24 + 4 * i, rec->user_flags[i]);
    mbx_put64(p + 40, rec->modseq);
    mbx_put64(p + 48, (uint64_t)rec->last_updated);
    memcpy(p + 56, rec->digest, MAILBOX_DIGEST_LEN);
    mbx_put32(p + MBX_REC_SIZE - 4, crc32c(p, MBX_REC_SIZE - 4));
}

/* 0 and *rec, or -1 on a CRC mismatch. */
static int mbx_rec_decode(const unsigned char *p, struct mailbox_record *rec)
{
    int i;

    if (mbx_get32(p + MBX_REC_SIZE - 4) != crc32c(p, MBX_REC_SIZE - 4))
        return -1;
    memset(rec, 0, sizeof(*rec));
    rec->uid = mbx_get32(p);
    rec->flags = mbx_get32(p + 4);
    rec->internaldate = (int64_t)mbx_get64(p + 8);
    rec->size = mbx_get32(p + 16);
    rec->header_size = mbx_get32(p + 20);
    for (i = 0; i < MAILBOX_USER_FLAGS / 32; i++)
        rec->user_flags[i] = mbx_get32(p + 24 + 4 * i);
    rec->modseq = mbx_get64(p + 40);
    rec->last_updated = (int64_t)mbx_get64(p + 48);
    memcpy(rec->digest, p + 56, MAILBOX_DIGEST_LEN);
    return 0;
}

static off_t mbx_rec_offset(uint32_t recno)
{
    return (off_t)MBX_HDR_AREA + (off_t)recno * MBX_REC_SIZE;
}

/* ---------------------------------------------------------------------- */
/* the handle and the per-process registry                                */

#define MBX_DIRTY_RECORDS 1u   /* records in [0, visible) being changed */
#define MBX_DIRTY_QUOTA 2u     /* counters changed, quota not yet told */

struct mbx_pending {
    uint32_t uid;
    uint32_t visible_at_reserve;  /* header visible when it was reserved */
};

struct mailbox {
    struct mailbox *next;      /* registry */
    struct mailbox **pprev;    /* what points to this one (O(1) removal) */
    struct mailbox *hnext;     /* the registry's bucket of path_hash */
    struct mailbox **hpprev;
    uint32_t path_hash;        /* of index_path */
    pid_t pid;                 /* the process that opened it */
    int refcount;
    const struct imapconf *conf;
    char *name, *partition, *uniqueid, *dir, *index_path, *header_path;
    int fd;                    /* cyrus.index, the only one in the process */
    dev_t dev;
    ino_t ino;
    off_t lock_size;           /* its size, from mbx_lock_fd()'s stat() */
    dev_t hdr_dev;             /* cyrus.header as last read: inode */
    ino_t hdr_ino;
    off_t hdr_size;            /* and size and change time: a replaced */
    struct timespec hdr_ctime; /* file's inode number may be reused */
    char *flags[MAILBOX_USER_FLAGS];
    int locktype;              /* 0 or enum mailbox_locktype */
    struct mbx_slot slot;      /* the current header */
    int cur_slot;              /* 0 or 1: where `slot` lives on disk */
    struct mailbox_header pub; /* what mailbox_get_header() shows */
    int records_changed;       /* rewrite_record under this lock */
    int dir_changed;           /* entries of dir changed under this lock */
    int counters_changed;      /* header counters moved under this lock */
    int flags_changed;         /* records' flags rewritten in place under
                                * this lock, and nothing else */
    int defer_flags;           /* !spool_sync_flags: flag changes unsynced */
    int unsynced;              /* flag changes of this process not yet
                                * synced (mailbox_flush()) */
    int notify;                /* header written: wake IDLE sessions */
    struct mbx_pending *pending;  /* this process's reservations */
    size_t npending, pending_alloc;
    /* records read ahead under the current lock (mbx_read_rec): visible
     * records [ra_first, ra_first + ra_n), which only an exclusive lock
     * holder rewrites (through mbx_write_rec, which keeps ra current);
     * dropped at every lock and unlock */
    unsigned char *ra;
    uint32_t ra_first, ra_n;
    uint32_t ra_next;          /* the record after the last one read:
                                  reading it starts a sequential run */
    /* the last record read alone or written under the current lock (a
     * pending one beyond the read-ahead: the finish reads its own
     * record up to three times); dropped with the read-ahead */
    unsigned char one[MBX_REC_SIZE];
    uint32_t one_recno;
    int one_ok;
};

static struct mailbox *mbx_registry;

/* The registry by hash of the index path: a delivery opens a mailbox
 * while the process has dozens open, and walking them all (each handle
 * its own allocation, a cache miss apiece) cost more than the rest of
 * the lookup. */
#define MBX_REG_BUCKETS 256
static struct mailbox *mbx_reg_bucket[MBX_REG_BUCKETS];

/* FNV-1a of a path. */
static uint32_t mbx_path_hash(const char *p)
{
    uint32_t h = 2166136261u;

    for (; *p; p++)
        h = (h ^ (unsigned char)*p) * 16777619u;
    return h;
}

/* This process's handle of the index at `path`, or NULL. */
static struct mailbox *mbx_registry_find(pid_t pid, const char *path)
{
    uint32_t h = mbx_path_hash(path);
    struct mailbox *mb;

    for (mb = mbx_reg_bucket[h % MBX_REG_BUCKETS]; mb; mb = mb->hnext)
        if (mb->path_hash == h && mb->pid == pid &&
            strcmp(mb->index_path, path) == 0)
            return mb;
    return NULL;
}


static void mbx_publish(struct mailbox *mb)
{
    mb->pub.uidvalidity = mb->slot.uidvalidity;
    mb->pub.uidnext = mb->slot.uidnext;
    mb->pub.num_records = mb->slot.num_records;
    mb->pub.visible = mb->slot.visible;
    mb->pub.exists = mb->slot.exists;
    mb->pub.highestmodseq = mb->slot.highestmodseq;
    mb->pub.quota_used = mb->slot.quota_used;
    mb->pub.last_appenddate = mb->slot.last_appenddate;
    mb->pub.compactions = mb->slot.compactions;
    mb->pub.deletedmodseq = mb->slot.deletedmodseq;
}

static void mbx_free_flags(char **flags)
{
    int i;

    for (i = 0; i < MAILBOX_USER_FLAGS; i++) {
        free(flags[i]);
        flags[i] = NULL;
    }
}

static void mbx_free(struct mailbox *mb)
{
    if (!mb)
        return;
    if (mb->fd >= 0)
        close(mb->fd);
    free(mb->name);
    free(mb->partition);
    free(mb->uniqueid);
    free(mb->dir);
    free(mb->index_path);
    free(mb->header_path);
    mbx_free_flags(mb->flags);
    free(mb->pending);
    free(mb->ra);
    free(mb);
}

static int mbx_own_pending(const struct mailbox *mb, uint32_t uid,
                           size_t *idx_r)
{
    size_t i;

    for (i = 0; i < mb->npending; i++) {
        if (mb->pending[i].uid == uid) {
            if (idx_r)
                *idx_r = i;
            return 1;
        }
    }
    return 0;
}

/* ---------------------------------------------------------------------- */
/* locks                                                                  */

static int mbx_fcntl(int fd, int cmd, int type, off_t start, off_t len)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = (short)type;
    fl.l_whence = SEEK_SET;
    fl.l_start = start;
    fl.l_len = len;
    for (;;) {
        if (fcntl(fd, cmd, &fl) == 0)
            return 0;
        if (errno == EINTR && cmd == F_SETLKW)
            continue;
        return -1;
    }
}

/* Is the record lock of recno held by another process? 1 yes, 0 no,
 * -1 error. */
static int mbx_record_lock_held(int fd, uint32_t recno)
{
    struct flock fl;

    memset(&fl, 0, sizeof(fl));
    fl.l_type = F_WRLCK;
    fl.l_whence = SEEK_SET;
    fl.l_start = mbx_rec_offset(recno);
    fl.l_len = MBX_REC_SIZE;
    if (fcntl(fd, F_GETLK, &fl) < 0)
        return -1;
    return fl.l_type != F_UNLCK;
}

static void mbx_release(struct mailbox *mb)
{
    if (mb->fd >= 0 && mbx_fcntl(mb->fd, F_SETLK, F_UNLCK, 0, 1) < 0)
        log_error("mailbox: unlock failed mailbox=<%s> error=<%s>", mb->name,
                  strerror(errno));
    mb->locktype = 0;
    mb->ra_n = 0;
    mb->one_ok = 0;
    mb->records_changed = 0;
    mb->dir_changed = 0;
    mb->counters_changed = 0;
    mb->flags_changed = 0;
    if (mb->notify) {
        /* after the unlock, so a woken session does not wait for it */
        mb->notify = 0;
        idlenotify_changed(mb->conf, mb->dir);
    }
}

/* ---------------------------------------------------------------------- */
/* header and records I/O                                                 */

/* Read both slots; the valid one with the higher generation counts.
 * *bad_r (may be NULL) gets a bit per damaged slot. */
static int mbx_read_slots(int fd, struct mbx_slot *s_r, int *cur_r,
                          int *bad_r)
{
    unsigned char area[MBX_HDR_AREA];
    struct mbx_slot s0, s1;
    int ok0, ok1;

    if (fs_pread_all(fd, area, sizeof(area), 0) < 0)
        return errno == EIO ? STORE_CORRUPT : STORE_IOERROR;
    ok0 = mbx_slot_decode(area, &s0) == 0;
    ok1 = mbx_slot_decode(area + MBX_SLOT_SIZE, &s1) == 0;
    if (bad_r)
        *bad_r = (ok0 ? 0 : 1) | (ok1 ? 0 : 2);
    if (!ok0 && !ok1)
        return STORE_CORRUPT;
    if (ok0 && (!ok1 || s0.generation >= s1.generation)) {
        *s_r = s0;
        *cur_r = 0;
    } else {
        *s_r = s1;
        *cur_r = 1;
    }
    return STORE_OK;
}

static int mbx_read_header(struct mailbox *mb)
{
    int r = mbx_read_slots(mb->fd, &mb->slot, &mb->cur_slot, NULL);

    if (r == STORE_CORRUPT)
        log_error("mailbox: no valid index header mailbox=<%s> file=<%s>",
                  mb->name, mb->index_path);
    else if (r)
        log_error("mailbox: index read failed mailbox=<%s> error=<%s>",
                  mb->name, strerror(errno));
    if (r == STORE_OK)
        mbx_publish(mb);
    return r;
}

/* Write mb->slot, one generation on, into the other slot. */
static int mbx_write_header(struct mailbox *mb)
{
    unsigned char p[MBX_SLOT_LEN];
    int other = !mb->cur_slot;

    mb->slot.generation++;
    mbx_slot_encode(&mb->slot, p);
    if (fs_pwrite_all(mb->fd, p, sizeof(p),
                      (off_t)other * MBX_SLOT_SIZE) < 0) {
        int e = errno;

        log_error("mailbox: index header write failed mailbox=<%s> "
                  "error=<%s>", mb->name, strerror(e));
        mb->slot.generation--;
        return mbx_errno(e);
    }
    mb->cur_slot = other;
    mb->notify = 1;
    mbx_publish(mb);
    return STORE_OK;
}

/* Read record recno from the file (no range check against the header).
 * STORE_NOTFOUND beyond the end of file, STORE_CORRUPT on a bad CRC. */
/* Records read at once when a caller walks the index in order. */
#define MBX_READAHEAD 64

/* Serve recno from the read-ahead, or fill it when recno continues a
 * sequential run of visible records.  Returns the record's bytes, or
 * NULL for "read it alone". */
static const unsigned char *mbx_readahead(struct mailbox *mb, uint32_t recno)
{
    uint32_t n;

    if (!mb->locktype)
        return NULL;
    if (recno >= mb->ra_first && recno - mb->ra_first < mb->ra_n)
        return mb->ra + (size_t)(recno - mb->ra_first) * MBX_REC_SIZE;
    if (recno != mb->ra_next || recno + 1 >= mb->slot.visible)
        return NULL;
    n = mb->slot.visible - recno;
    if (n > MBX_READAHEAD)
        n = MBX_READAHEAD;
    if (!mb->ra && !(mb->ra = malloc((size_t)MBX_READAHEAD * MBX_REC_SIZE)))
        return NULL;
    mb->ra_n = 0;
    mb->one_ok = 0;
    if (fs_pread_all(mb->fd, mb->ra, (size_t)n * MBX_REC_SIZE,
                     mbx_rec_offset(recno)) < 0)
        return NULL;            /* short or failed: the single read says */
    mb->ra_first = recno;
    mb->ra_n = n;
    return mb->ra;
}

static int mbx_read_rec(struct mailbox *mb, uint32_t recno,
                        struct mailbox_record *rec)
{
    unsigned char one[MBX_REC_SIZE];
    const unsigned char *p = mbx_readahead(mb, recno);

    mb->ra_next = recno + 1;
    if (p) {
        if (mbx_rec_decode(p, rec) == 0)
            return STORE_OK;
        mb->ra_n = 0;           /* the single read below logs it */
        mb->one_ok = 0;
    }
    if (mb->locktype && mb->one_ok && mb->one_recno == recno &&
        mbx_rec_decode(mb->one, rec) == 0)
        return STORE_OK;
    p = one;
    if (fs_pread_all(mb->fd, one, sizeof(one), mbx_rec_offset(recno)) < 0) {
        if (errno == EIO)
            return STORE_NOTFOUND;
        log_error("mailbox: record read failed mailbox=<%s> error=<%s>",
                  mb->name, strerror(errno));
        return STORE_IOERROR;
    }
    if (mbx_rec_decode(p, rec) < 0) {
        log_error("mailbox: record checksum mismatch mailbox=<%s> "
                  "recno=<%u>", mb->name, recno);
        return STORE_CORRUPT;
    }
    if (mb->locktype) {
        memcpy(mb->one, one, sizeof(one));
        mb->one_recno = recno;
        mb->one_ok = 1;
    }
    return STORE_OK;
}

static int mbx_write_rec(struct mailbox *mb, uint32_t recno,
                         const struct mailbox_record *rec)
{
    unsigned char p[MBX_REC_SIZE];

    mbx_rec_encode(rec, p);
    if (fs_pwrite_all(mb->fd, p, sizeof(p), mbx_rec_offset(recno)) < 0) {
        int e = errno;

        mb->ra_n = 0;
        mb->one_ok = 0;
        log_error("mailbox: record write failed mailbox=<%s> recno=<%u> "
                  "error=<%s>", mb->name, recno, strerror(e));
        return mbx_errno(e);
    }
    if (recno >= mb->ra_first && recno - mb->ra_first < mb->ra_n)
        memcpy(mb->ra + (size_t)(recno - mb->ra_first) * MBX_REC_SIZE, p,
               sizeof(p));
    if (mb->locktype) {
        memcpy(mb->one, p, sizeof(p));
        mb->one_recno = recno;
        mb->one_ok = 1;
    }
    return STORE_OK;
}

/* This boot of the system, as a nonzero number (from the kernel's boot
 * id; its boot time when that is missing), 0 when neither can be read:
 * then every flag change is synced.  Computed once per process.  The
 * environment's CYRUSDELIVER_BOOT_ID, when set and not empty, stands for
 * the kernel's boot id: a test that simulates a power loss restarts its
 * servers with another value (a reboot without rebooting). */
static uint64_t mbx_boot_stamp(void)
{
    static int done;
    static uint64_t stamp;
    const char *env = getenv("CYRUSDELIVER_BOOT_ID");
    char line[128];
    FILE *f;

    if (env && *env) {      /* not kept: a forked test child sets it */
        uint64_t v = (uint64_t)crc32c(env, strlen(env)) << 32 |
                     crc32c(env, strlen(env) / 2);

        return v ? v : 1;
    }
    if (done)
        return stamp;
    done = 1;
    f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (f) {
        if (fgets(line, sizeof(line), f))
            stamp = (uint64_t)crc32c(line, strlen(line)) << 32 |
                    crc32c(line, strlen(line) / 2);
        fclose(f);
    }
    if (!stamp && (f = fopen("/proc/stat", "re")) != NULL) {
        while (fgets(line, sizeof(line), f))
            if (!strncmp(line, "btime ", 6)) {
                stamp = strtoull(line + 6, NULL, 10);
                break;
            }
        fclose(f);
    }
    return stamp;
}

static int mbx_datasync(struct mailbox *mb)
{
    if (fs_datasync(mb->fd) < 0) {
        int e = errno;

        log_error("mailbox: index sync failed mailbox=<%s> error=<%s>",
                  mb->name, strerror(e));
        return mbx_errno(e);
    }
    return STORE_OK;
}

/* ---------------------------------------------------------------------- */
/* cyrus.header                                                           */

/* Is s[0..len) an IMAP atom usable as a keyword? */
static int mbx_atom_ok(const char *s, size_t len)
{
    size_t i;

    if (len == 0 || len > 100 || s[0] == '\\')
        return 0;
    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];

        if (c <= 0x20 || c >= 0x7f || strchr("(){%*\"\\]", c))
            return 0;
    }
    return 1;
}

#define MBX_HEADER_FILE_MAX (64 * 1024)

/* Read cyrus.header into the handle.  STORE_CORRUPT when it does not
 * parse, STORE_NOTFOUND when missing. */
static void mbx_header_remember(struct mailbox *mb, const struct stat *sb)
{
    mb->hdr_dev = sb->st_dev;
    mb->hdr_ino = sb->st_ino;
    mb->hdr_size = sb->st_size;
    mb->hdr_ctime = sb->st_ctim;
}

static int mbx_header_same(const struct mailbox *mb, const struct stat *sb)
{
    return sb->st_ino == mb->hdr_ino && sb->st_dev == mb->hdr_dev &&
           sb->st_size == mb->hdr_size &&
           sb->st_ctim.tv_sec == mb->hdr_ctime.tv_sec &&
           sb->st_ctim.tv_nsec == mb->hdr_ctime.tv_nsec;
}

static int mbx_load_header_file(struct mailbox *mb)
{
    char *flags[MAILBOX_USER_FLAGS];
    char data[MBX_HEADER_FILE_MAX];
    const char *p, *end, *nl, *tab;
    char *uniqueid = NULL;
    struct stat sb;
    ssize_t n;
    size_t len = 0, mlen = strlen(MBX_HEADER_MAGIC_LINE);
    int fd, nflags = 0, e;

    fd = open(mb->header_path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        e = errno;
        log_error("mailbox: cannot open header file=<%s> error=<%s>",
                  mb->header_path, strerror(e));
        return e == ENOENT ? STORE_NOTFOUND : STORE_IOERROR;
    }
    if (fstat(fd, &sb) < 0) {
        close(fd);
        return STORE_IOERROR;
    }
    for (;;) {
        n = read(fd, data + len, sizeof(data) - len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            break;
        len += (size_t)n;
        /* the file is replaced by rename, never changed in place: its
         * size as of the fstat() is all there is (no read for the EOF) */
        if (len == sizeof(data) || (sb.st_size > 0 &&
                                    len >= (size_t)sb.st_size))
            break;
    }
    close(fd);
    if (n < 0)
        return STORE_IOERROR;
    if (len == sizeof(data))
        goto corrupt;
    memset(flags, 0, sizeof(flags));
    p = data;
    end = data + len;
    /* line 1: magic */
    nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl || (size_t)(nl - p) != mlen || memcmp(p, MBX_HEADER_MAGIC_LINE,
                                                   mlen) != 0)
        goto corrupt;
    p = nl + 1;
    /* line 2: NAME TAB UNIQUEID */
    nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl)
        goto corrupt;
    tab = memchr(p, '\t', (size_t)(nl - p));
    if (!tab)
        goto corrupt;
    uniqueid = strndup(tab + 1, (size_t)(nl - tab - 1));
    if (!uniqueid)
        return STORE_NOMEM;
    p = nl + 1;
    /* line 3: user flags */
    nl = memchr(p, '\n', (size_t)(end - p));
    if (!nl)
        nl = end;
    while (p < nl) {
        const char *w = p;

        while (p < nl && *p != ' ')
            p++;
        if (p > w) {
            if (nflags == MAILBOX_USER_FLAGS || !mbx_atom_ok(w, (size_t)(p - w)))
                goto corrupt_flags;
            flags[nflags] = strndup(w, (size_t)(p - w));
            if (!flags[nflags]) {
                mbx_free_flags(flags);
                free(uniqueid);
                return STORE_NOMEM;
            }
            nflags++;
        }
        while (p < nl && *p == ' ')
            p++;
    }
    mbx_free_flags(mb->flags);
    memcpy(mb->flags, flags, sizeof(flags));
    free(mb->uniqueid);
    mb->uniqueid = uniqueid;
    mbx_header_remember(mb, &sb);
    return STORE_OK;

corrupt_flags:
    mbx_free_flags(flags);
corrupt:
    free(uniqueid);
    log_error("mailbox: header file does not parse file=<%s>",
              mb->header_path);
    return STORE_CORRUPT;
}

/* Re-read cyrus.header when another process replaced it.  The inode
 * alone does not tell: the number of a file replaced a moment ago is
 * often given to the next one; the size (keywords are only added) and
 * the change time (nanoseconds) go with it. */
static int mbx_refresh_header_file(struct mailbox *mb)
{
    struct stat sb;

    if (mb->hdr_ino == 0) {   /* never read (mailbox_open()): no compare */
        int r = mbx_load_header_file(mb);

        return r == STORE_NOTFOUND ? STORE_CORRUPT : r;   /* as stat()'s */
    }
    if (stat(mb->header_path, &sb) < 0)
        return errno == ENOENT ? STORE_CORRUPT : STORE_IOERROR;
    if (mbx_header_same(mb, &sb))
        return STORE_OK;
    return mbx_load_header_file(mb);
}

static int mbx_write_header_file(const char *path, const char *dir,
                                 const char *name, const char *uniqueid,
                                 char *const *flags)
{
    struct buf text = BUF_INITIALIZER;
    int r;

    r = mbx_header_text(name, uniqueid, flags, &text);
    if (r == STORE_OK)
        r = mbx_write_file_atomic(path, text.s, text.len);
    if (r == STORE_OK && fs_fsync_dir(dir) < 0) {
        log_error("mailbox: fsync failed dir=<%s> error=<%s>", dir,
                  strerror(errno));
        r = mbx_errno(errno);
    }
    buf_free(&text);
    return r;
}

/* ---------------------------------------------------------------------- */
/* message files                                                          */

/* Size, header size and SHA-1 of an open file (read from the start). */
static int mbx_scan_file(int fd, uint64_t *size_r, uint32_t *header_size_r,
                         unsigned char digest[MAILBOX_DIGEST_LEN])
{
    unsigned char buf[64 * 1024];
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int mdlen = 0;
    EVP_MD_CTX *ctx;
    uint64_t off = 0, hsize = 0;
    int state = 0;   /* 0 line start, 1 CR at line start, 2 mid line, 3 done */
    off_t pos = 0;
    ssize_t n;
    int r = STORE_OK;

    ctx = EVP_MD_CTX_new();
    if (!ctx)
        return STORE_NOMEM;
    if (EVP_DigestInit_ex(ctx, EVP_sha1(), NULL) != 1) {
        EVP_MD_CTX_free(ctx);
        return STORE_INTERNAL;
    }
    for (;;) {
        ssize_t i;

        n = pread(fd, buf, sizeof(buf), pos);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = STORE_IOERROR;
            break;
        }
        if (n == 0)
            break;
        if (EVP_DigestUpdate(ctx, buf, (size_t)n) != 1) {
            r = STORE_INTERNAL;
            break;
        }
        for (i = 0; i < n && state != 3; i++) {
            unsigned char c = buf[i];

            if (state == 0)
                state = c == '\n' ? 3 : c == '\r' ? 1 : 2;
            else if (state == 1)
                state = c == '\n' ? 3 : 2;
            else if (c == '\n')
                state = 0;
            if (state == 3)
                hsize = off + (uint64_t)i + 1;
        }
        off += (uint64_t)n;
        pos += n;
    }
    if (r == STORE_OK && EVP_DigestFinal_ex(ctx, md, &mdlen) != 1)
        r = STORE_INTERNAL;
    EVP_MD_CTX_free(ctx);
    if (r)
        return r;
    if (mdlen != MAILBOX_DIGEST_LEN)
        return STORE_INTERNAL;
    memcpy(digest, md, MAILBOX_DIGEST_LEN);
    *size_r = off;
    if (state != 3)
        hsize = off;
    *header_size_r = hsize > UINT32_MAX ? UINT32_MAX : (uint32_t)hsize;
    return STORE_OK;
}

void mailbox_message_path(const struct mailbox *mb, uint32_t uid,
                          struct buf *out)
{
    buf_reset(out);
    buf_printf(out, "%s/%u.", mb->dir, uid);
}

int mailbox_open_message(const struct mailbox *mb, uint32_t uid, int *fd_r)
{
    struct buf path = BUF_INITIALIZER;
    int fd, e;

    *fd_r = -1;
    mailbox_message_path(mb, uid, &path);
    fd = open(buf_cstring(&path), O_RDONLY | O_CLOEXEC);
    e = errno;
    buf_free(&path);
    if (fd < 0)
        return e == ENOENT ? STORE_NOTFOUND : STORE_IOERROR;
    *fd_r = fd;
    return STORE_OK;
}

/* Does DIR/UID. hold exactly what rec describes?  STORE_OK (and the file
 * synced), STORE_NOTFOUND (absent or different), STORE_IOERROR. */
static int mbx_verify_message(struct mailbox *mb,
                              const struct mailbox_record *rec)
{
    unsigned char digest[MAILBOX_DIGEST_LEN];
    uint64_t size;
    uint32_t hsize;
    struct stat sb;
    int fd, r;

    r = mailbox_open_message(mb, rec->uid, &fd);
    if (r)
        return r;
    if (fs_fstat_id(fd, &sb) < 0 || (uint64_t)sb.st_size != rec->size) {
        close(fd);
        return STORE_NOTFOUND;
    }
    r = mbx_scan_file(fd, &size, &hsize, digest);
    if (r == STORE_OK && (size != rec->size ||
                          memcmp(digest, rec->digest, sizeof(digest)) != 0))
        r = STORE_NOTFOUND;
    if (r == STORE_OK && fsync(fd) < 0)
        r = mbx_errno(errno);
    close(fd);
    return r;
}

static void mbx_unlink_message(struct mailbox *mb, uint32_t uid)
{
    struct buf path = BUF_INITIALIZER;

    mailbox_message_path(mb, uid, &path);
    if (unlink(buf_cstring(&path)) < 0 && errno != ENOENT)
        log_error("mailbox: unlink failed file=<%s> error=<%s>",
                  buf_cstring(&path), strerror(errno));
    else
        mb->dir_changed = 1;
    buf_free(&path);
}

/* ---------------------------------------------------------------------- */
/* quota                                                                  */

/* Bring the quota database in line with the header (when a root covers
 * the mailbox).  Failures are logged: the MBX_DIRTY_QUOTA bit stays and
 * the next exclusive locker tries again. */
static int mbx_quota_push(struct mailbox *mb)
{
    struct buf root = BUF_INITIALIZER;
    struct quota_db *q;
    int r;

    r = quota_shared(mb->conf, &q);
    if (r) {
        log_error("mailbox: quota database unavailable mailbox=<%s> "
                  "error=<%s>", mb->name, store_strerror(r));
        return r;
    }
    r = quota_findroot(q, mb->name, &root);
    if (r == STORE_NOTFOUND)
        r = STORE_OK;   /* no root: nothing to tell */
    else if (r == STORE_OK)
        r = quota_update_mailbox(q, mb->name, mb->slot.quota_used,
                                 mb->slot.exists);
    if (r)
        log_error("mailbox: quota update failed mailbox=<%s> error=<%s>",
                  mb->name, store_strerror(r));
    buf_free(&root);
    return r;
}

/* After a header write that carried MBX_DIRTY_QUOTA: tell quota, then
 * clear the bit (a lost clearing write costs one more idempotent push). */
static void mbx_quota_settle(struct mailbox *mb)
{
    if (!(mb->slot.dirty & MBX_DIRTY_QUOTA))
        return;
    if (mbx_quota_push(mb) != STORE_OK)
        return;
    mb->slot.dirty &= ~MBX_DIRTY_QUOTA;
    (void)mbx_write_header(mb);
}

/* ---------------------------------------------------------------------- */
/* visibility and recovery                                                */

/* Advance the visible prefix over every resolved record; each newly
 * visible message gets its modseq and enters the counters.  Sets
 * MBX_DIRTY_QUOTA in the in-memory header when counters moved; the
 * caller writes the header. */
static int mbx_advance(struct mailbox *mb, int *changed_r)
{
    struct mailbox_record rec;
    int64_t now = (int64_t)time(NULL);
    int r;

    while (mb->slot.visible < mb->slot.num_records) {
        r = mbx_read_rec(mb, mb->slot.visible, &rec);
        if (r)
            return r == STORE_NOTFOUND ? STORE_CORRUPT : r;
        if (rec.flags & MAILBOX_FLAG_PENDING)
            break;
        if (!(rec.flags & (MAILBOX_FLAG_ABORTED | MAILBOX_FLAG_EXPUNGED))) {
            rec.modseq = ++mb->slot.highestmodseq;
            rec.last_updated = now;
            r = mbx_write_rec(mb, mb->slot.visible, &rec);
            if (r)
                return r;
            mb->slot.exists++;
            mb->slot.quota_used += rec.size;
            mb->slot.last_appenddate = now;
            mb->slot.dirty |= MBX_DIRTY_QUOTA;
            mb->counters_changed = 1;
        }
        mb->slot.visible++;
        *changed_r = 1;
    }
    return STORE_OK;
}

/* Recompute exists, quota_used and highestmodseq from the visible
 * records (a writer died while changing them). */
static int mbx_recompute(struct mailbox *mb, const char *why)
{
    struct mailbox_record rec;
    uint32_t i, exists = 0;
    uint64_t used = 0, maxmod = mb->slot.highestmodseq;
    int r;

    for (i = 0; i < mb->slot.visible; i++) {
        r = mbx_read_rec(mb, i, &rec);
        if (r)
            return r == STORE_NOTFOUND ? STORE_CORRUPT : r;
        if (rec.modseq > maxmod)
            maxmod = rec.modseq;
        if (rec.flags & (MAILBOX_FLAG_ABORTED | MAILBOX_FLAG_EXPUNGED))
            continue;
        exists++;
        used += rec.size;
    }
    log_warning("mailbox: counters recomputed after %s "
                "mailbox=<%s> exists=<%u> was=<%u>", why, mb->name, exists,
                mb->slot.exists);
    mb->slot.exists = exists;
    mb->slot.quota_used = used;
    mb->slot.highestmodseq = maxmod;
    mb->slot.dirty &= ~MBX_DIRTY_RECORDS;
    mb->slot.dirty |= MBX_DIRTY_QUOTA;
    return STORE_OK;
}

/* Recovery step a's damaged records in front of intact ones, in the
 * tail [from, from + n) of the file: raw holds the tail's bytes, tail
 * its decoded records (a damaged one is decoded again and stays uid 0
 * unless replaced here); first is the first damaged record.
 *
 * A power loss leaves the tail as the page cache last wrote back each
 * 512-byte sector, and a 128-byte record never straddles a sector, so a
 * record that was ever synced is intact (its old or its new contents).
 * A damaged record was therefore never synced, nor was anything after it
 * (a sync round covers the whole file): no record from it on was ever
 * acknowledged through the index (a journaled one is restored from the
 * journal, store/journal.c).  But the intact records after it may hold
 * PENDING reservations whose files verify, and cutting the file at the
 * damage would throw away the uids they name.  So each damaged record
 * becomes an ABORTED placeholder with a free uid between its intact
 * neighbours (its file, a reservation's that never reached the index,
 * is unlinked), and the intact records stay for step c.  It is refused
 * (STORE_CORRUPT: reconstruct) when a damaged record is visible, when an
 * intact record after it is held by a live appender (then the damage is
 * not a power loss: recovery would have run before that appender), or
 * when the neighbours leave no uid for it. */
static int mbx_fill_gaps(struct mailbox *mb, uint32_t from, uint32_t n,
                         const unsigned char *raw,
                         struct mailbox_record *tail, uint32_t first)
{
    uint32_t i, k, prev = 0, lastgood = UINT32_MAX;
    int r;

    if (first < mb->slot.visible)
        goto corrupt;
    for (i = 0; i < n; i++)
        if (mbx_rec_decode(raw + (size_t)i * MBX_REC_SIZE, &tail[i]) == 0)
            lastgood = i;
        else
            memset(&tail[i], 0, sizeof(tail[i]));
    for (i = first - from; i < lastgood; i++) {
        int held;

        if (tail[i].uid == 0)
            continue;
        held = mbx_record_lock_held(mb->fd, from + i);
        if (held < 0)
            return STORE_IOERROR;
        if (held)
            goto corrupt;
    }
    /* the uid before the first damaged record */
    if (first > from) {
        prev = tail[first - from - 1].uid;
    } else if (from > 0) {
        struct mailbox_record before;

        r = mbx_read_rec(mb, from - 1, &before);
        if (r)
            return r;
        prev = before.uid;
    }
    for (i = first - from; i < lastgood; i = k) {
        uint32_t next;

        if (tail[i].uid != 0) {
            prev = tail[i].uid;
            k = i + 1;
            continue;
        }
        for (k = i; k < lastgood && tail[k].uid == 0; k++)
            ;
        next = tail[k].uid;
        if (next <= prev || next - prev - 1 < k - i)
            goto corrupt;
        for (; i < k; i++) {
            struct mailbox_record *rec = &tail[i];

            memset(rec, 0, sizeof(*rec));
            rec->uid = ++prev;
            rec->flags = MAILBOX_FLAG_ABORTED;
            log_warning("mailbox: damaged unsynced record made an aborted "
                        "placeholder mailbox=<%s> recno=<%u> uid=<%u>",
                        mb->name, from + i, rec->uid);
            mbx_unlink_message(mb, rec->uid);
            r = mbx_write_rec(mb, from + i, rec);
            if (r)
                return r;
        }
        prev = next;
        k++;
    }
    return mbx_datasync(mb);
corrupt:
    log_error("mailbox: damaged record before intact ones mailbox=<%s> "
              "recno=<%u>", mb->name, first);
    return STORE_CORRUPT;
}

/* Run under the exclusive lock, after the header was read. */
static int mbx_recover(struct mailbox *mb)
{
    struct mbx_slot *s = &mb->slot;
    struct mailbox_record *tail = NULL;
    unsigned char *raw = NULL;
    /* the size mbx_lock_fd() found under this lock (no writer since) */
    off_t isize = mb->lock_size;
    uint64_t body;
    uint32_t nfile, from, i, nvalid, bad = UINT32_MAX, lastuid = 0;
    int changed = 0, commit_sync = 0, abort_sync = 0, r = STORE_OK;

    if (isize < MBX_HDR_AREA)
        return STORE_CORRUPT;
    body = (uint64_t)isize - MBX_HDR_AREA;
    if (body / MBX_REC_SIZE > UINT32_MAX)
        return STORE_CORRUPT;
    nfile = (uint32_t)(body / MBX_REC_SIZE);
    if (s->visible > s->num_records || s->synced > s->visible ||
        nfile < s->visible) {
        log_error("mailbox: index header inconsistent mailbox=<%s> "
                  "visible=<%u> records=<%u> in_file=<%u>", mb->name,
                  s->visible, s->num_records, nfile);
        return STORE_CORRUPT;
    }

    /* every record not known durable in its final state: [synced, end) */
    from = s->synced;
    if (nfile > from) {
        size_t n = (size_t)(nfile - from);

        raw = malloc(n * MBX_REC_SIZE);
        tail = calloc(n, sizeof(*tail));
        if (!raw || !tail) {
            r = STORE_NOMEM;
            goto out;
        }
        if (fs_pread_all(mb->fd, raw, n * MBX_REC_SIZE,
                         mbx_rec_offset(from)) < 0) {
            r = STORE_IOERROR;
            goto out;
        }
        for (i = 0; i < n; i++) {
            if (mbx_rec_decode(raw + (size_t)i * MBX_REC_SIZE, &tail[i]) < 0) {
                if (bad == UINT32_MAX)
                    bad = from + i;
            } else if (bad != UINT32_MAX) {
                /* damaged records before intact ones: placeholders */
                r = mbx_fill_gaps(mb, from, n, raw, tail, bad);
                if (r)
                    goto out;
                bad = UINT32_MAX;
                break;
            }
        }
        if (i < n) {
            /* the gaps are filled: find a damaged tail after them */
            for (i = 0; i < n; i++)
                if (tail[i].uid == 0 && bad == UINT32_MAX)
                    bad = from + i;
        }
    }
    nvalid = bad == UINT32_MAX ? nfile : bad;
    if (nvalid < s->visible) {
        log_error("mailbox: damaged visible record mailbox=<%s> recno=<%u>",
                  mb->name, nvalid);
        r = STORE_CORRUPT;
        goto out;
    }
    /* a torn or never-synced tail (never acknowledged: a sync round
     * would have made it whole) is cut off */
    if (body % MBX_REC_SIZE || nvalid < nfile) {
        log_warning("mailbox: cutting unfinished records off the index "
                    "mailbox=<%s> records=<%u> in_file=<%u> partial=<%u>",
                    mb->name, nvalid, nfile,
                    (unsigned)(body % MBX_REC_SIZE));
        mb->ra_n = 0;
        mb->one_ok = 0;
        if (ftruncate(mb->fd, mbx_rec_offset(nvalid)) < 0) {
            r = mbx_errno(errno);
            goto out;
        }
    }
    for (i = from; i < nvalid; i++) {
        if (tail[i - from].uid <= lastuid || tail[i - from].uid == 0) {
            log_error("mailbox: record uids out of order mailbox=<%s> "
                      "recno=<%u>", mb->name, i);
            r = STORE_CORRUPT;
            goto out;
        }
        lastuid = tail[i - from].uid;
    }
    if (nvalid != s->num_records) {
        if (nvalid < s->num_records) {
            /* reservations whose record never reached the disk: their
             * links may have; no record can refer to these uids */
            uint32_t u, lo = lastuid + 1;

            if (nvalid > 0 && lastuid == 0) {
                struct mailbox_record last;

                if (mbx_read_rec(mb, nvalid - 1, &last) == STORE_OK)
                    lo = last.uid + 1;
                else
                    lo = s->uidnext;
            }
            for (u = lo; u < s->uidnext && u - lo < 10000; u++)
                mbx_unlink_message(mb, u);
        }
        log_warning("mailbox: index record count corrected mailbox=<%s> "
                    "header=<%u> file=<%u>", mb->name, s->num_records, nvalid);
        s->num_records = nvalid;
        changed = 1;
    }
    if (lastuid >= s->uidnext) {
        s->uidnext = lastuid + 1;
        changed = 1;
    }

    for (i = from; i < nvalid; i++) {
        struct mailbox_record *rec = &tail[i - from];
        int held;

        if (!(rec->flags & MAILBOX_FLAG_PENDING))
            continue;
        if (i < s->visible) {
            /* visible, so committed; the write that cleared PENDING (and
             * set the modseq) was lost in a crash */
            rec->flags &= ~MAILBOX_FLAG_PENDING;
            if (rec->modseq == 0)
                rec->modseq = ++s->highestmodseq;
            r = mbx_write_rec(mb, i, rec);
            if (r)
                goto out;
            changed = 1;
            continue;
        }
        if (mbx_own_pending(mb, rec->uid, NULL))
            continue;   /* ours, alive */
        held = mbx_record_lock_held(mb->fd, i);
        if (held < 0) {
            r = STORE_IOERROR;
            goto out;
        }
        if (held)
            continue;   /* its appender is alive */
        r = mbx_verify_message(mb, rec);
        if (r == STORE_OK) {
            log_info("mailbox: recovered append committed mailbox=<%s> "
                     "uid=<%u>", mb->name, rec->uid);
            rec->flags &= ~MAILBOX_FLAG_PENDING;
            commit_sync = 1;
        } else if (r == STORE_NOTFOUND) {
            log_info("mailbox: recovered append aborted mailbox=<%s> "
                     "uid=<%u>", mb->name, rec->uid);
            rec->flags = (rec->flags & ~MAILBOX_FLAG_PENDING) |
                         MAILBOX_FLAG_ABORTED;
            mbx_unlink_message(mb, rec->uid);
            abort_sync = 1;
        } else {
            goto out;
        }
        r = mbx_write_rec(mb, i, rec);
        if (r)
            goto out;
        changed = 1;
    }
    /* what becomes visible must be durable first: the files verified
     * (synced by verification), their directory, and the records */
    if (commit_sync && fs_fsync_dir(mb->dir) < 0) {
        r = mbx_errno(errno);
        goto out;
    }
    if (commit_sync || abort_sync) {
        r = mbx_datasync(mb);
        if (r)
            goto out;
    }

    if ((s->dirty & MBX_DIRTY_RECORDS) ||
        (s->boot != 0 && s->boot != mbx_boot_stamp())) {
        /* a writer died in the middle of a change, or the system
         * restarted after flag changes that were never synced */
        r = mbx_recompute(mb, (s->dirty & MBX_DIRTY_RECORDS) ?
                          "an interrupted change" : "a restart");
        if (r)
            goto out;
        s->boot = 0;
        changed = 1;
    }
    r = mbx_advance(mb, &changed);
    if (r)
        goto out;
    if (commit_sync || abort_sync) {
        s->synced = s->visible;
        changed = 1;
    }
    if (changed)
        r = mbx_write_header(mb);

out:
    free(raw);
    free(tail);
    return r;
}

/* Remember which file mb->fd is open on (mbx_lock_fd() compares the
 * path with it); called after every change of mb->fd. */
static void mbx_note_inode(struct mailbox *mb)
{
    struct stat sb;

    if (mb->fd >= 0 && fs_fstat_id(mb->fd, &sb) == 0) {
        mb->dev = sb.st_dev;
        mb->ino = sb.st_ino;
    } else {
        mb->dev = 0;
        mb->ino = 0;
    }
}

/* Take the fcntl mailbox lock on mb->fd; when the index at the path is
 * another file (cleanup or reconstruct replaced it), move to that file
 * and lock again. */
static int mbx_lock_fd(struct mailbox *mb, int type)
{
    struct stat sb, fsb;
    int tries, nfd, e;
    size_t i;

    for (tries = 0;; tries++) {
        if (mbx_fcntl(mb->fd, F_SETLKW, type, 0, 1) < 0) {
            log_error("mailbox: lock failed mailbox=<%s> error=<%s>",
                      mb->name, strerror(errno));
            return STORE_IOERROR;
        }
        if (fs_stat_id(mb->index_path, &sb) < 0) {
            e = errno;
            mbx_fcntl(mb->fd, F_SETLK, F_UNLCK, 0, 1);
            return e == ENOENT ? STORE_NOTFOUND : STORE_IOERROR;
        }
        /* mb->dev/ino name the file mb->fd is open on (mbx_note_inode()
         * after every change of mb->fd; 0 = unknown): the path still
         * names it without an fstat() per lock */
        if (mb->ino != 0 && sb.st_ino == mb->ino && sb.st_dev == mb->dev) {
            /* while mb->fd is open its inode number names no other
             * file, so this is mb->fd's file and its size */
            mb->lock_size = sb.st_size;
            return STORE_OK;
        }
        if (fs_fstat_id(mb->fd, &fsb) == 0 && sb.st_ino == fsb.st_ino &&
            sb.st_dev == fsb.st_dev) {
            mb->dev = fsb.st_dev;
            mb->ino = fsb.st_ino;
            mb->lock_size = sb.st_size;
            return STORE_OK;
        }
        nfd = open(mb->index_path, O_RDWR | O_CLOEXEC);
        e = errno;
        mbx_fcntl(mb->fd, F_SETLK, F_UNLCK, 0, 1);
        if (nfd < 0)
            return e == ENOENT ? STORE_NOTFOUND : STORE_IOERROR;
        if (mb->npending)
            log_warning("mailbox: index replaced under pending appends "
                        "mailbox=<%s> pending=<%zu>", mb->name, mb->npending);
        for (i = 0; i < mb->npending; i++)
            mb->pending[i].visible_at_reserve = 0;
        close(mb->fd);
        mb->fd = nfd;
        mbx_note_inode(mb);
        if (tries > 100)
            return STORE_IOERROR;
    }
}

/* Take the lock, read the header, recover under an exclusive lock. */
static int mbx_lock(struct mailbox *mb, enum mailbox_locktype type)
{
    int r;

    if (mb->locktype)
        return STORE_INTERNAL;
    mb->ra_n = 0;
    mb->one_ok = 0;
    r = mbx_lock_fd(mb, type == MAILBOX_LOCK_EXCLUSIVE ? F_WRLCK : F_RDLCK);
    if (r)
        return r;
    mb->locktype = type;
    r = mbx_read_header(mb);
    if (r == STORE_OK)
        r = mbx_refresh_header_file(mb);
    if (r == STORE_OK && type == MAILBOX_LOCK_EXCLUSIVE)
        r = mbx_recover(mb);
    if (r) {
        mbx_release(mb);
        return r;
    }
    mbx_publish(mb);
    return STORE_OK;
}

/* The exclusive lock for the append path: recovery, and a quota update
 * a dead process left undone. */
static int mbx_lock_append(struct mailbox *mb)
{
    int r = mbx_lock(mb, MAILBOX_LOCK_EXCLUSIVE);

    if (r == STORE_OK)
        mbx_quota_settle(mb);
    return r;
}

/* ---------------------------------------------------------------------- */
/* open, close, lock                                                      */

int mailbox_open(const struct imapconf *conf, const char *name,
                 const char *partition, struct mailbox **mb_r)
{
    struct buf dir = BUF_INITIALIZER, ipath = BUF_INITIALIZER;
    struct mailbox *mb;
    struct stat sb;
    pid_t pid = procid_get();
    int r, e;

    *mb_r = NULL;
    r = mbx_resolve(conf, name, partition, &partition, NULL, &dir);
    if (r) {
        buf_free(&dir);
        return r;
    }
    buf_printf(&ipath, "%s/%s", buf_cstring(&dir), MAILBOX_INDEX_FNAME);
    mb = mbx_registry_find(pid, buf_cstring(&ipath));
    if (mb) {
        mb->refcount++;
        *mb_r = mb;
        buf_free(&dir);
        buf_free(&ipath);
        return STORE_OK;
    }
    mb = calloc(1, sizeof(*mb));
    if (!mb) {
        buf_free(&dir);
        buf_free(&ipath);
        return STORE_NOMEM;
    }
    mb->fd = -1;
    mb->pid = pid;
    mb->refcount = 1;
    mb->conf = conf;
    mb->defer_flags = !conf || !imapconf_getswitch(conf, "spool_sync_flags");
    mb->name = strdup(name);
    mb->partition = strdup(partition);
    mb->dir = buf_release(&dir);
    mb->index_path = buf_release(&ipath);
    if (mb->dir)
        buf_printf(&ipath, "%s/%s", mb->dir, MAILBOX_HEADER_FNAME);
    mb->header_path = buf_release(&ipath);
    if (!mb->name || !mb->partition || !mb->dir || !mb->index_path ||
        !mb->header_path) {
        mbx_free(mb);
        return STORE_NOMEM;
    }
    mb->fd = open(mb->index_path, O_RDWR | O_CLOEXEC);
    if (mb->fd < 0) {
        e = errno;
        mbx_free(mb);
        if (e == ENOENT)
            return STORE_NOTFOUND;
        log_error("mailbox: open failed mailbox=<%s> error=<%s>", name,
                  strerror(e));
        return STORE_IOERROR;
    }
    if (fs_fstat_id(mb->fd, &sb) < 0) {
        mbx_free(mb);
        return STORE_IOERROR;
    }
    mb->dev = sb.st_dev;
    mb->ino = sb.st_ino;
    /* a shared lock for the first look (no other descriptor of this file
     * is open in this process, so no lock of ours is lost) */
    r = mbx_lock(mb, MAILBOX_LOCK_SHARED);
    if (r == STORE_OK)
        mbx_release(mb);
    if (r) {
        mbx_free(mb);
        return r;
    }
    mb->path_hash = mbx_path_hash(mb->index_path);
    mb->next = mbx_registry;
    if (mbx_registry)
        mbx_registry->pprev = &mb->next;
    mb->pprev = &mbx_registry;
    mbx_registry = mb;
    {
        struct mailbox **b = &mbx_reg_bucket[mb->path_hash % MBX_REG_BUCKETS];

        mb->hnext = *b;
        if (*b)
            (*b)->hpprev = &mb->hnext;
        mb->hpprev = b;
        *b = mb;
    }
    *mb_r = mb;
    return STORE_OK;
}

static int mbx_registry_has_own(void)
{
    struct mailbox *mb;

    for (mb = mbx_registry; mb; mb = mb->next)
        if (mb->pid == procid_get())
            return 1;
    return 0;
}

void mailbox_close(struct mailbox **mbp)
{
    struct mailbox *mb = mbp ? *mbp : NULL;

    if (!mb)
        return;
    *mbp = NULL;
    if (mb->pid != procid_get())
        return;   /* inherited over fork(): the parent's */
    if (--mb->refcount > 0)
        return;
    if (mb->locktype)
        mailbox_unlock(mb);
    mailbox_flush(mb);
    while (mb->npending) {
        uint32_t uid = mb->pending[0].uid;

        log_warning("mailbox: closed with a pending append mailbox=<%s> "
                    "uid=<%u>", mb->name, uid);
        if (mailbox_append_cancel(mb, uid) != STORE_OK &&
            mb->npending && mb->pending[0].uid == uid) {
            /* could not cancel: closing drops the record lock, and the
             * next writer's recovery resolves it */
            mb->pending[0] = mb->pending[--mb->npending];
        }
    }
    if (mb->pprev) {
        *mb->pprev = mb->next;
        if (mb->next)
            mb->next->pprev = mb->pprev;
    }
    if (mb->hpprev) {
        *mb->hpprev = mb->hnext;
        if (mb->hnext)
            mb->hnext->hpprev = mb->hpprev;
    }
    mbx_free(mb);
    if (!mbx_registry_has_own())
        quota_shared_close();
}

/* Under a shared lock: is the first record behind the visible prefix a
 * dead appender's (PENDING, not this process's, its record lock free)?
 * Appends resolved after it wait behind it, acknowledged but unseen,
 * until an exclusive locker's recovery settles it. */
static int mbx_dead_blocker(struct mailbox *mb)
{
    struct mailbox_record rec;

    if (mb->slot.visible >= mb->slot.num_records)
        return 0;
    if (mbx_read_rec(mb, mb->slot.visible, &rec) != STORE_OK)
        return 0;
    if (!(rec.flags & MAILBOX_FLAG_PENDING) ||
        mbx_own_pending(mb, rec.uid, NULL))
        return 0;
    return mbx_record_lock_held(mb->fd, mb->slot.visible) == 0;
}

int mailbox_lock(struct mailbox *mb, enum mailbox_locktype type)
{
    int r;

    if (!mb || (type != MAILBOX_LOCK_SHARED && type != MAILBOX_LOCK_EXCLUSIVE))
        return STORE_INTERNAL;
    r = mbx_lock(mb, type);
    if (r == STORE_OK && type == MAILBOX_LOCK_SHARED &&
        mbx_dead_blocker(mb)) {
        /* a reader must not wait for the next append to see what was
         * acknowledged: settle the dead append (recovery, under the
         * exclusive lock) and look again */
        mbx_release(mb);
        r = mailbox_lock(mb, MAILBOX_LOCK_EXCLUSIVE);
        if (r == STORE_OK)
            r = mailbox_unlock(mb);
        if (r != STORE_OK)
            log_warning("mailbox: dead append not settled by a reader "
                        "mailbox=<%s> error=<%s>", mb->name,
                        store_strerror(r));
        r = mbx_lock(mb, type);
    }
    if (r || type != MAILBOX_LOCK_EXCLUSIVE)
        return r;
    /* bring quota in line (a no-op without a quota root) */
    if (mbx_quota_push(mb) == STORE_OK && (mb->slot.dirty & MBX_DIRTY_QUOTA)) {
        mb->slot.dirty &= ~MBX_DIRTY_QUOTA;
        (void)mbx_write_header(mb);
    }
    return STORE_OK;
}

int mailbox_lock_peek(struct mailbox *mb)
{
    if (!mb)
        return STORE_INTERNAL;
    return mbx_lock(mb, MAILBOX_LOCK_SHARED);
}

void mailbox_version(const struct mailbox *mb, struct mailbox_version *v)
{
    v->generation = mb->slot.generation;
    v->dev = (uint64_t)mb->dev;
    v->ino = (uint64_t)mb->ino;
}

int mailbox_unchanged(struct mailbox *mb, const struct stat *st,
                      const struct mailbox_version *v)
{
    struct mbx_slot cur;
    int cur_slot;

    if (!mb || !st || !v || mb->locktype || mb->fd < 0 || mb->ino == 0 ||
        mb->pid != procid_get())
        return 0;
    if ((uint64_t)st->st_ino != v->ino || (uint64_t)st->st_dev != v->dev ||
        st->st_ino != mb->ino || st->st_dev != mb->dev)
        return 0;
    if (mbx_read_slots(mb->fd, &cur, &cur_slot, NULL) != STORE_OK)
        return 0;
    return cur.generation == v->generation;
}

/* One commit round over the index (and the directory when its entries
 * changed). */
static int mbx_commit_round(struct mailbox *mb)
{
    struct commit_batch *b = NULL;
    int r;

    r = commit_batch_new(mb->conf, &b);
    if (r == STORE_OK) {
        commit_batch_own_files(b);
        r = commit_batch_add_fd(b, mb->fd);
    }
    if (r == STORE_OK && mb->dir_changed)
        r = commit_batch_add_dir(b, mb->dir);
    if (r == STORE_OK)
        r = commit_batch_sync(b);
    commit_batch_free(&b);
    return r;
}

int mailbox_unlock(struct mailbox *mb)
{
    int r = STORE_OK;

    if (!mb || !mb->locktype)
        return STORE_INTERNAL;
    if (mb->locktype == MAILBOX_LOCK_EXCLUSIVE && mb->flags_changed &&
        !(mb->records_changed || mb->dir_changed || mb->counters_changed)) {
        /* flags only: to the page cache, synced by the next commit round
         * of the mailbox or mailbox_flush() (FLAG CHANGES) */
        mb->slot.dirty &= ~MBX_DIRTY_RECORDS;
        r = mbx_write_header(mb);
        if (r == STORE_OK)
            mb->unsynced = 1;
    } else if (mb->locktype == MAILBOX_LOCK_EXCLUSIVE &&
        (mb->records_changed || mb->dir_changed || mb->counters_changed)) {
        if (mb->counters_changed)
            mb->slot.dirty |= MBX_DIRTY_QUOTA;
        r = mbx_write_header(mb);
        if (r == STORE_OK)
            r = mbx_commit_round(mb);
        if (r == STORE_OK) {
            /* everything before the round is durable: records clean */
            mb->slot.dirty &= ~MBX_DIRTY_RECORDS;
            mb->slot.synced = mb->slot.visible;
            mb->unsynced = 0;
            r = mbx_write_header(mb);
        } else {
            log_error("mailbox: commit failed mailbox=<%s> error=<%s>",
                      mb->name, store_strerror(r));
        }
        if (r == STORE_OK)
            mbx_quota_settle(mb);
    }
    mbx_release(mb);
    return r;
}

int mailbox_flush(struct mailbox *mb)
{
    int r;

    if (!mb || !mb->unsynced || mb->fd < 0 || mb->pid != procid_get())
        return STORE_OK;
    r = mbx_datasync(mb);
    if (r == STORE_OK)
        mb->unsynced = 0;
    return r;
}

int mailbox_unsynced(const struct mailbox *mb)
{
    return mb && mb->unsynced;
}

const struct mailbox_header *mailbox_get_header(const struct mailbox *mb)
{
    return &mb->pub;
}

const char *mailbox_name(const struct mailbox *mb) { return mb->name; }
const char *mailbox_partition(const struct mailbox *mb) { return mb->partition; }
const char *mailbox_uniqueid(const struct mailbox *mb)
{
    return mb->uniqueid ? mb->uniqueid : "";
}
const char *mailbox_dir(const struct mailbox *mb) { return mb->dir; }

int mailbox_read_record(struct mailbox *mb, uint32_t recno,
                        struct mailbox_record *rec_r)
{
    int r;

    if (!mb || !rec_r || !mb->locktype)
        return STORE_INTERNAL;
    if (recno >= mb->slot.num_records)
        return STORE_NOTFOUND;
    r = mbx_read_rec(mb, recno, rec_r);
    if (r == STORE_NOTFOUND)
        r = STORE_CORRUPT;   /* the header counts it: the file is short */
    if (r == STORE_OK && recno < mb->slot.visible)
        rec_r->flags &= ~MAILBOX_FLAG_PENDING;  /* visible = committed */
    return r;
}

/* Binary search for uid in records [lo, hi). */
static int mbx_search(struct mailbox *mb, uint32_t lo, uint32_t hi,
                      uint32_t uid, uint32_t *recno_r,
                      struct mailbox_record *rec_r)
{
    struct mailbox_record rec;
    int r;

    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;

        r = mbx_read_rec(mb, mid, &rec);
        if (r)
            return r == STORE_NOTFOUND ? STORE_CORRUPT : r;
        if (rec.uid == uid) {
            *recno_r = mid;
            if (rec_r)
                *rec_r = rec;   /* the caller need not read it again */
            return STORE_OK;
        }
        if (rec.uid < uid)
            lo = mid + 1;
        else
            hi = mid;
    }
    return STORE_NOTFOUND;
}

/* A small index (every visible record fits the read-ahead): read all its
 * records at once, so that the searches of this lock read nothing more.
 * A failed read leaves the single reads to tell. */
static void mbx_ra_fill_all(struct mailbox *mb)
{
    uint32_t n = mb->slot.visible;

    if (n == 0 || n > MBX_READAHEAD || (mb->ra_first == 0 && mb->ra_n >= n))
        return;
    if (!mb->ra && !(mb->ra = malloc((size_t)MBX_READAHEAD * MBX_REC_SIZE)))
        return;
    mb->ra_n = 0;
    mb->one_ok = 0;
    if (fs_pread_all(mb->fd, mb->ra, (size_t)n * MBX_REC_SIZE,
                     mbx_rec_offset(0)) < 0)
        return;
    mb->ra_first = 0;
    mb->ra_n = n;
}

int mailbox_find_uid(struct mailbox *mb, uint32_t uid, uint32_t *recno_r)
{
    if (!mb || !recno_r || !mb->locktype)
        return STORE_INTERNAL;
    mbx_ra_fill_all(mb);
    return mbx_search(mb, 0, mb->slot.visible, uid, recno_r, NULL);
}

int mailbox_rewrite_record(struct mailbox *mb, uint32_t recno,
                           const struct mailbox_record *rec)
{
    struct mailbox_record old;
    uint32_t nflags;
    int r, defer, expunging;

    if (!mb || !rec || mb->locktype != MAILBOX_LOCK_EXCLUSIVE)
        return STORE_INTERNAL;
    if (recno >= mb->slot.num_records)
        return STORE_NOTFOUND;
    if (recno >= mb->slot.visible)
        return STORE_INTERNAL;
    r = mbx_read_rec(mb, recno, &old);
    if (r)
        return r == STORE_NOTFOUND ? STORE_CORRUPT : r;
    if (old.flags & MAILBOX_FLAG_ABORTED)
        return STORE_NOTFOUND;   /* never was a message */
    defer = mb->defer_flags && mbx_boot_stamp() != 0;
    if (defer && mb->slot.boot != mbx_boot_stamp()) {
        /* the first in-place change of this boot: the stamp that makes a
         * locker after a power loss recompute is durable before any
         * record changes without a sync (see FLAG CHANGES) */
        uint64_t oboot = mb->slot.boot;
        uint32_t odirty = mb->slot.dirty;

        mb->slot.boot = mbx_boot_stamp();
        mb->slot.dirty |= MBX_DIRTY_RECORDS;
        r = mbx_write_header(mb);
        if (r == STORE_OK)
            r = mbx_datasync(mb);
        if (r) {
            mb->slot.boot = oboot;
            mb->slot.dirty = odirty;
            return r;
        }
    } else if (!(mb->slot.dirty & MBX_DIRTY_RECORDS)) {
        /* before the first in-place change: a writer that dies now
         * leaves a header that says "recompute" (the page cache keeps
         * the order of one process's writes; against a power loss the
         * stamp above or, without deferral, this sync covers it) */
        mb->slot.dirty |= MBX_DIRTY_RECORDS;
        r = mbx_write_header(mb);
        if (r == STORE_OK && !defer)
            r = mbx_datasync(mb);
        if (r) {
            mb->slot.dirty &= ~MBX_DIRTY_RECORDS;
            return r;
        }
    }
    nflags = (rec->flags & (MAILBOX_SYSTEM_FLAGS | MAILBOX_FLAG_EXPUNGED)) |
             (old.flags & MAILBOX_FLAG_EXPUNGED);
    expunging = (nflags & MAILBOX_FLAG_EXPUNGED) &&
                !(old.flags & MAILBOX_FLAG_EXPUNGED);
    if (expunging) {
        if (mb->slot.exists)
            mb->slot.exists--;
        mb->slot.quota_used = mb->slot.quota_used >= old.size ?
                              mb->slot.quota_used - old.size : 0;
        mb->counters_changed = 1;
    }
    old.flags = nflags;
    memcpy(old.user_flags, rec->user_flags, sizeof(old.user_flags));
    old.modseq = ++mb->slot.highestmodseq;
    old.last_updated = (int64_t)time(NULL);
    r = mbx_write_rec(mb, recno, &old);
    /* an expunge is made durable at the unlock, a flag change may wait */
    if (expunging || !defer)
        mb->records_changed = 1;
    else
        mb->flags_changed = 1;
    mbx_publish(mb);
    return r;
}

int mailbox_restore_counters(struct mailbox *mb, uint32_t uidvalidity,
                             uint32_t uidnext, uint64_t highestmodseq)
{
    if (!mb || mb->locktype != MAILBOX_LOCK_EXCLUSIVE)
        return STORE_INTERNAL;
    if (uidvalidity && uidvalidity != mb->slot.uidvalidity) {
        if (mb->slot.num_records != 0)
            return STORE_EXISTS;
        mb->slot.uidvalidity = uidvalidity;
    }
    if (uidnext > mb->slot.uidnext)
        mb->slot.uidnext = uidnext;
    if (highestmodseq > mb->slot.highestmodseq)
        mb->slot.highestmodseq = highestmodseq;
    /* expunges of the mailbox this one restores are not records here */
    if (highestmodseq > mb->slot.deletedmodseq)
        mb->slot.deletedmodseq = highestmodseq;
    mb->records_changed = 1;   /* the header is written at the unlock */
    mbx_publish(mb);
    return STORE_OK;
}

int mailbox_user_flag(struct mailbox *mb, const char *name, int create,
                      int *num_r)
{
    size_t len;
    struct stat sb;
    int i, freeslot = -1, r, reread = 0;

    if (!mb || !name || !num_r)
        return STORE_INTERNAL;
    len = strnlen(name, 101);
    if (!mbx_atom_ok(name, len))
        return STORE_BADNAME;
again:
    freeslot = -1;
    for (i = 0; i < MAILBOX_USER_FLAGS; i++) {
        if (!mb->flags[i]) {
            if (freeslot < 0)
                freeslot = i;
            continue;
        }
        if (!strcasecmp(mb->flags[i], name)) {
            *num_r = i;
            return STORE_OK;
        }
    }
    if (!create)
        return STORE_NOTFOUND;
    if (mb->locktype != MAILBOX_LOCK_EXCLUSIVE)
        return STORE_INTERNAL;
    if (!reread) {
        /* the names as on disk now, under the exclusive lock, before a
         * slot is taken: never one another process has just defined */
        reread = 1;
        r = mbx_load_header_file(mb);
        if (r)
            return r;
        goto again;
    }
    if (freeslot < 0)
        return STORE_OVERQUOTA;
    mb->flags[freeslot] = strndup(name, len);
    if (!mb->flags[freeslot])
        return STORE_NOMEM;
    r = mbx_write_header_file(mb->header_path, mb->dir, mb->name,
                              mb->uniqueid, mb->flags);
    if (r) {
        free(mb->flags[freeslot]);
        mb->flags[freeslot] = NULL;
        return r;
    }
    if (stat(mb->header_path, &sb) == 0)
        mbx_header_remember(mb, &sb);
    *num_r = freeslot;
    return STORE_OK;
}

const char *mailbox_user_flag_name(const struct mailbox *mb, int num)
{
    if (!mb || num < 0 || num >= MAILBOX_USER_FLAGS)
        return NULL;
    return mb->flags[num];
}

/* Read records [0, n) into a new array. */
static int mbx_read_all(struct mailbox *mb, uint32_t n,
                        struct mailbox_record **recs_r)
{
    struct mailbox_record *recs;
    unsigned char *raw;
    uint32_t i;

    *recs_r = NULL;
    recs = calloc(n ? n : 1, sizeof(*recs));
    raw = malloc(n ? (size_t)n * MBX_REC_SIZE : 1);
    if (!recs || !raw) {
        free(recs);
        free(raw);
        return STORE_NOMEM;
    }
    if (n && fs_pread_all(mb->fd, raw, (size_t)n * MBX_REC_SIZE,
                          MBX_HDR_AREA) < 0) {
        int e = errno;

        free(recs);
        free(raw);
        return e == EIO ? STORE_CORRUPT : STORE_IOERROR;
    }
    for (i = 0; i < n; i++) {
        if (mbx_rec_decode(raw + (size_t)i * MBX_REC_SIZE, &recs[i]) < 0) {
            log_error("mailbox: record checksum mismatch mailbox=<%s> "
                      "recno=<%u>", mb->name, i);
            free(recs);
            free(raw);
            return STORE_CORRUPT;
        }
    }
    free(raw);
    *recs_r = recs;
    return STORE_OK;
}

/* Write a complete index (both slots valid, slot 0 current) to a new file
 * `tmp`, synced; the descriptor into *fd_r, locked exclusively. */
static int mbx_write_new_index(const char *tmp, const struct mbx_slot *s,
                               const struct mailbox_record *recs, uint32_t n,
                               int *fd_r)
{
    unsigned char *data;
    size_t len = MBX_HDR_AREA + (size_t)n * MBX_REC_SIZE;
    struct mbx_slot prev = *s;
    uint32_t i;
    int fd, e, r = STORE_OK;

    *fd_r = -1;
    data = calloc(1, len);
    if (!data)
        return STORE_NOMEM;
    prev.generation = s->generation - 1;
    mbx_slot_encode(s, data);
    mbx_slot_encode(&prev, data + MBX_SLOT_SIZE);
    for (i = 0; i < n; i++)
        mbx_rec_encode(&recs[i], data + MBX_HDR_AREA + (size_t)i * MBX_REC_SIZE);
    fd = open(tmp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, MBX_FILE_MODE);
    if (fd < 0) {
        e = errno;
        log_error("mailbox: create failed file=<%s> error=<%s>", tmp,
                  strerror(e));
        free(data);
        return mbx_errno(e);
    }
    if (fs_write_all(fd, data, len) < 0 || fsync(fd) < 0) {
        e = errno;
        log_error("mailbox: write failed file=<%s> error=<%s>", tmp,
                  strerror(e));
        r = mbx_errno(e);
    } else if (mbx_fcntl(fd, F_SETLK, F_WRLCK, 0, 1) < 0) {
        r = STORE_IOERROR;
    }
    free(data);
    if (r) {
        close(fd);
        unlink(tmp);
        return r;
    }
    *fd_r = fd;
    return STORE_OK;
}

/* Put a new index file (written, synced and locked as nfd) in place of
 * the handle's, and move the handle to it. */
static int mbx_install_index(struct mailbox *mb, const char *tmp, int nfd)
{
    int e;

    if (rename(tmp, mb->index_path) < 0) {
        e = errno;
        log_error("mailbox: rename failed file=<%s> error=<%s>",
                  mb->index_path, strerror(e));
        close(nfd);
        unlink(tmp);
        return mbx_errno(e);
    }
    if (fs_fsync_dir(mb->dir) < 0) {
        e = errno;
        log_error("mailbox: fsync failed dir=<%s> error=<%s>", mb->dir,
                  strerror(e));
        /* the rename happened: move on to the new file anyway */
    } else {
        e = 0;
    }
    close(mb->fd);   /* drops our locks on the old file */
    mb->fd = nfd;
    mbx_note_inode(mb);
    return e ? mbx_errno(e) : STORE_OK;
}

int mailbox_cleanup(struct mailbox *mb)
{
    return mailbox_cleanup_batch(mb, 0, 0, NULL, NULL);
}

/* A record cleanup may take: aborted, or expunged before `before` (0: any
 * time). */
static int mbx_cleanup_eligible(const struct mailbox_record *rec,
                                int64_t before)
{
    if (rec->flags & MAILBOX_FLAG_ABORTED)
        return 1;
    if (!(rec->flags & MAILBOX_FLAG_EXPUNGED))
        return 0;
    return before == 0 || rec->last_updated <= before;
}

int mailbox_cleanup_batch(struct mailbox *mb, int64_t expunged_before,
                          uint32_t max_files, uint32_t *removed_r,
                          int *more_r)
{
    struct mailbox_record *recs = NULL;
    struct mbx_slot ns;
    struct buf tmp = BUF_INITIALIZER;
    uint32_t i, n, kept = 0, removable = 0, waiting = 0;
    uint64_t deletedmodseq;
    unsigned char *take = NULL;
    int pending = 0, nfd, r;

    if (removed_r)
        *removed_r = 0;
    if (more_r)
        *more_r = 0;
    if (!mb || mb->locktype != MAILBOX_LOCK_EXCLUSIVE)
        return STORE_INTERNAL;
    /* the expunges of this lock must be durable before their files go */
    if (mb->records_changed) {
        r = mbx_datasync(mb);
        if (r)
            return r;
    }
    n = mb->slot.num_records;
    r = mbx_read_all(mb, n, &recs);
    if (r)
        return r;
    take = calloc(n ? n : 1, 1);
    if (!take) {
        free(recs);
        return STORE_NOMEM;
    }
    for (i = 0; i < n; i++) {
        if (i >= mb->slot.visible && (recs[i].flags & MAILBOX_FLAG_PENDING))
            pending = 1;
        if (i < mb->slot.visible &&
            mbx_cleanup_eligible(&recs[i], expunged_before)) {
            if (max_files && removable >= max_files) {
                waiting++;
                continue;
            }
            mbx_unlink_message(mb, recs[i].uid);
            take[i] = 1;
            removable++;
        }
    }
    if (removed_r)
        *removed_r = removable;
    if (removable == 0)
        goto out;
    /* an append in progress: the records stay (their files are gone) and
     * the compaction waits for a later batch */
    if (pending || mb->slot.visible != n) {
        if (more_r)
            *more_r = 2;
        goto out;
    }
    if (more_r)
        *more_r = waiting > 0;

    /* QRESYNC's bound: expunges up to this modseq are no longer listed */
    deletedmodseq = mb->slot.deletedmodseq;
    for (i = 0; i < n; i++)
        if (take[i] && recs[i].modseq > deletedmodseq)
            deletedmodseq = recs[i].modseq;
    for (i = 0; i < n; i++) {
        if (take[i])
            continue;
        recs[i].flags &= ~MAILBOX_FLAG_PENDING;
        recs[kept++] = recs[i];
    }
    ns = mb->slot;
    ns.deletedmodseq = deletedmodseq;
    ns.generation = mb->slot.generation + 2;
    ns.num_records = ns.visible = ns.synced = kept;
    ns.compactions++;
    ns.dirty &= ~MBX_DIRTY_RECORDS;   /* the new file is whole and synced */
    ns.boot = 0;
    buf_printf(&tmp, "%s.NEW", mb->index_path);
    r = mbx_write_new_index(buf_cstring(&tmp), &ns, recs, kept, &nfd);
    if (r) {
        if (more_r)
            *more_r = 0;
        goto out;
    }
    r = mbx_install_index(mb, buf_cstring(&tmp), nfd);
    mb->slot = ns;
    mb->cur_slot = 0;
    mb->records_changed = 0;
    mbx_publish(mb);
    log_info("mailbox: compacted index mailbox=<%s> records=<%u> "
             "removed=<%u> waiting=<%u>", mb->name, kept, removable,
             waiting);

out:
    free(take);
    free(recs);
    buf_free(&tmp);
    return r;
}

/* ---------------------------------------------------------------------- */
/* append                                                                 */

/* Copy src to a new file dst (another file system), synced. */
static int mbx_copy_file(const char *src, const char *dst)
{
    char buf[64 * 1024];
    int in, out, r = STORE_OK;
    ssize_t n;

    in = open(src, O_RDONLY | O_CLOEXEC);
    if (in < 0)
        return mbx_errno(errno);
    out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, MBX_FILE_MODE);
    if (out < 0) {
        r = errno == EEXIST ? STORE_EXISTS : mbx_errno(errno);
        close(in);
        return r;
    }
    for (;;) {
        n = read(in, buf, sizeof(buf));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            r = STORE_IOERROR;
            break;
        }
        if (n == 0)
            break;
        if (fs_write_all(out, buf, (size_t)n) < 0) {
            r = mbx_errno(errno);
            break;
        }
    }
    if (r == STORE_OK && fsync(out) < 0)
        r = mbx_errno(errno);
    if (close(out) < 0 && r == STORE_OK)
        r = mbx_errno(errno);
    close(in);
    if (r)
        unlink(dst);
    return r;
}

/* link(stage, DIR/UID.); a stale file of that name (a reservation whose
 * record never reached the disk) is replaced. */
static int mbx_link_message(struct mailbox *mb, const char *stage,
                            uint32_t uid)
{
    struct buf path = BUF_INITIALIZER;
    int tries, r = STORE_OK, e;

    mailbox_message_path(mb, uid, &path);
    for (tries = 0; tries < 3; tries++) {
        if (link(stage, buf_cstring(&path)) == 0) {
            r = STORE_OK;
            break;
        }
        e = errno;
        if (e == EXDEV) {
            r = mbx_copy_file(stage, buf_cstring(&path));
            if (r != STORE_EXISTS)
                break;
            e = EEXIST;
        }
        if (e == EEXIST) {
            log_warning("mailbox: replacing stale message file file=<%s>",
                        buf_cstring(&path));
            unlink(buf_cstring(&path));
            r = STORE_IOERROR;
            continue;
        }
        log_error("mailbox: link failed file=<%s> error=<%s>",
                  buf_cstring(&path), strerror(e));
        r = mbx_errno(e);
        break;
    }
    buf_free(&path);
    return r;
}

int mailbox_append_reserve(struct mailbox *mb, const char *stage_path,
                           const struct mailbox_msginfo *info,
                           int64_t internaldate, uint32_t sysflags,
                           struct commit_batch *batch, uint32_t *uid_r)
{
    return mailbox_append_reserve_keywords(mb, stage_path, info,
                                           internaldate, sysflags, NULL, 0,
                                           0, batch, uid_r);
}

int mailbox_append_reserve_keywords(struct mailbox *mb,
                                    const char *stage_path,
                                    const struct mailbox_msginfo *info,
                                    int64_t internaldate, uint32_t sysflags,
                                    const char *const *keywords,
                                    size_t nkeywords, int strict,
                                    struct commit_batch *batch,
                                    uint32_t *uid_r)
{
    struct mailbox_record rec;
    uint32_t uid, recno;
    uint32_t user[MAILBOX_USER_FLAGS / 32];
    off_t off;
    size_t k;
    int r;

    if (uid_r)
        *uid_r = 0;
    if (!mb || !stage_path || !info || !uid_r || mb->locktype ||
        mb->pid != procid_get())
        return STORE_INTERNAL;
    if (mb->npending == mb->pending_alloc) {
        size_t na = mb->pending_alloc ? mb->pending_alloc * 2 : 4;
        struct mbx_pending *np = realloc(mb->pending, na * sizeof(*np));

        if (!np)
            return STORE_NOMEM;
        mb->pending = np;
        mb->pending_alloc = na;
    }
    r = mbx_lock_append(mb);
    if (r)
        return r;
    /* the keywords, defined as needed under this lock: the record is
     * written with them, so the message is never visible without them */
    memset(user, 0, sizeof(user));
    for (k = 0; k < nkeywords; k++) {
        int num, kr;

        if (!keywords || !keywords[k])
            continue;
        kr = mailbox_user_flag(mb, keywords[k], 1, &num);
        if (kr == STORE_OK) {
            user[num / 32] |= 1u << (num % 32);
        } else if (!strict
                   && (kr == STORE_BADNAME || kr == STORE_OVERQUOTA)) {
            log_warning("mailbox: keyword not set mailbox=<%s> "
                        "keyword=<%s> error=<%s>", mb->name,
                        mbx_atom_ok(keywords[k], strnlen(keywords[k], 101))
                            ? keywords[k] : "(invalid)",
                        store_strerror(kr));
        } else {
            r = kr;
            goto out;
        }
    }
    if (batch) {
        r = commit_batch_add_fd(batch, mb->fd);
        if (r == STORE_OK)
            r = commit_batch_add_dir(batch, mb->dir);
        if (r)
            goto out;
    }
    uid = mb->slot.uidnext;
    recno = mb->slot.num_records;
    if (uid == 0 || uid == UINT32_MAX || recno == UINT32_MAX) {
        log_error("mailbox: uid space exhausted mailbox=<%s>", mb->name);
        r = STORE_IOERROR;
        goto out;
    }
    off = mbx_rec_offset(recno);
    r = mbx_link_message(mb, stage_path, uid);
    if (r)
        goto out;
    if (mbx_fcntl(mb->fd, F_SETLK, F_WRLCK, off, MBX_REC_SIZE) < 0) {
        log_error("mailbox: record lock failed mailbox=<%s> error=<%s>",
                  mb->name, strerror(errno));
        r = STORE_IOERROR;
        goto out_unlink;
    }
    memset(&rec, 0, sizeof(rec));
    rec.uid = uid;
    rec.flags = (sysflags & MAILBOX_SYSTEM_FLAGS) | MAILBOX_FLAG_PENDING;
    memcpy(rec.user_flags, user, sizeof(rec.user_flags));
    rec.internaldate = internaldate;
    rec.size = info->size;
    rec.header_size = info->header_size;
    rec.last_updated = (int64_t)time(NULL);
    memcpy(rec.digest, info->digest, MAILBOX_DIGEST_LEN);
    r = mbx_write_rec(mb, recno, &rec);
    if (r == STORE_OK) {
        mb->slot.num_records++;
        mb->slot.uidnext++;
        r = mbx_write_header(mb);
        if (r) {
            mb->slot.num_records--;
            mb->slot.uidnext--;
        }
    }
    if (r) {
        mb->ra_n = 0;
        mb->one_ok = 0;
        if (ftruncate(mb->fd, off) < 0)
            log_error("mailbox: truncate failed mailbox=<%s> error=<%s>",
                      mb->name, strerror(errno));
        mbx_fcntl(mb->fd, F_SETLK, F_UNLCK, off, MBX_REC_SIZE);
        goto out_unlink;
    }
    mb->pending[mb->npending].uid = uid;
    mb->pending[mb->npending].visible_at_reserve = mb->slot.visible;
    mb->npending++;
    *uid_r = uid;
    goto out;

out_unlink:
    mbx_unlink_message(mb, uid);
out:
    mbx_release(mb);
    return r;
}

static void mbx_pending_remove(struct mailbox *mb, size_t idx)
{
    mb->pending[idx] = mb->pending[--mb->npending];
}

/* Shared part of finish and cancel, under the exclusive lock: resolve
 * this process's pending append uid (commit or cancel), release its record
 * lock, advance the visible prefix.  *changed_r is set when the in-memory
 * header moved and needs writing; quota is not told (the caller does,
 * after the header write). */
static int mbx_resolve_locked(struct mailbox *mb, uint32_t uid, int commit,
                              int *changed_r)
{
    struct mailbox_record rec;
    uint32_t recno, v_r;
    size_t pi;
    int r;

    *changed_r = 0;
    if (!mbx_own_pending(mb, uid, &pi))
        return STORE_NOTFOUND;
    v_r = mb->pending[pi].visible_at_reserve;
    r = mbx_search(mb, 0, mb->slot.num_records, uid, &recno, &rec);
    if (r == STORE_NOTFOUND) {
        log_error("mailbox: pending record vanished mailbox=<%s> uid=<%u>",
                  mb->name, uid);
        mbx_pending_remove(mb, pi);
        return STORE_NOTFOUND;
    }
    if (r)
        return r;
    if (rec.flags & MAILBOX_FLAG_PENDING) {
        if (commit) {
            rec.flags &= ~MAILBOX_FLAG_PENDING;
            r = mbx_write_rec(mb, recno, &rec);
        } else {
            /* ABORTED durable before anything moves past it */
            rec.flags = (rec.flags & ~MAILBOX_FLAG_PENDING) |
                        MAILBOX_FLAG_ABORTED;
            r = mbx_write_rec(mb, recno, &rec);
            if (r == STORE_OK)
                r = mbx_datasync(mb);
            mbx_unlink_message(mb, uid);
        }
        if (r)
            return r;
    } else if (commit && (rec.flags & MAILBOX_FLAG_ABORTED)) {
        r = STORE_IOERROR;   /* resolved by someone else as aborted */
    } else if (!commit && !(rec.flags & MAILBOX_FLAG_ABORTED)) {
        log_warning("mailbox: cancel of a committed append mailbox=<%s> "
                    "uid=<%u>", mb->name, uid);
    }
    mbx_fcntl(mb->fd, F_SETLK, F_UNLCK, mbx_rec_offset(recno), MBX_REC_SIZE);
    mbx_pending_remove(mb, pi);
    if (r)
        return r;
    r = mbx_advance(mb, changed_r);
    if (r)
        return r;
    if (commit && v_r > mb->slot.synced && v_r <= mb->slot.visible &&
        !journal_mode(mb->conf)) {
        /* our sync round made everything resolved at reservation durable
         * (with spool_sync: journal the round synced the journal, not the
         * index: `synced` stays, see journal.c) */
        mb->slot.synced = v_r;
        *changed_r = 1;
    } else if (commit && journal_mode(mb->conf) &&
               mb->slot.visible - mb->slot.synced >= MBX_JOURNAL_SYNC_GAP) {
        /* with spool_sync: journal nothing else raises `synced` between
         * group rounds, and every exclusive lock's recovery reads
         * [synced, end) again: once that is MBX_JOURNAL_SYNC_GAP records,
         * one fdatasync() of the index (every write of the resolved
         * prefix was made before, under this lock or an earlier one)
         * makes [0, visible) durable in its resolved state */
        int rc;

        do
            rc = fdatasync(mb->fd);
        while (rc < 0 && errno == EINTR);
        if (rc == 0) {
            mb->slot.synced = mb->slot.visible;
            *changed_r = 1;
        } else {
            log_warning("mailbox: index sync failed, synced mark kept "
                        "mailbox=<%s> error=<%s>", mb->name, strerror(errno));
        }
    }
    return STORE_OK;
}

static int mbx_resolve_pending(struct mailbox *mb, uint32_t uid, int commit)
{
    int r, changed = 0;

    if (!mb || mb->pid != procid_get() || mb->locktype)
        return STORE_INTERNAL;
    if (!mbx_own_pending(mb, uid, NULL))
        return STORE_NOTFOUND;
    r = mbx_lock_append(mb);
    if (r)
        return r;
    r = mbx_resolve_locked(mb, uid, commit, &changed);
    if (r == STORE_OK && changed) {
        r = mbx_write_header(mb);
        if (r == STORE_OK)
            mbx_quota_settle(mb);
    }
    mbx_release(mb);
    return r;
}

int mailbox_append_finish(struct mailbox *mb, uint32_t uid)
{
    return mbx_resolve_pending(mb, uid, 1);
}

/* One distinct mailbox of mailbox_append_finish_many(). */
struct mbx_many {
    struct mailbox *mb;
    int lock_r;        /* STORE_OK while locked; else why it is not */
    int in_push;       /* in the current quota_update_many() call */
    int told;          /* quota handled (told, or failed: left to the
                          next locker) */
};

static int mbx_cmp_many(const void *a, const void *b)
{
    const struct mbx_many *x = a, *y = b;

    return strcmp(x->mb->index_path, y->mb->index_path);
}

/* Tell quota about every locked mailbox of ents[] whose header carries
 * MBX_DIRTY_QUOTA: one quota_update_many() per configuration (in practice
 * one), then bit 2 cleared and the header written for each mailbox told.
 * A failure leaves bit 2 set (logged); the next exclusive locker retries,
 * as with mbx_quota_settle(). */
static void mbx_quota_settle_many(struct mbx_many *ents, size_t ne,
                                  const char **names, uint64_t *bytes,
                                  uint64_t *msgs)
{
    struct buf root = BUF_INITIALIZER;
    size_t i, j, k;
    int r;

    for (i = 0; i < ne; i++) {
        const struct imapconf *conf;
        struct quota_db *q;

        if (ents[i].lock_r != STORE_OK || ents[i].told ||
            !(ents[i].mb->slot.dirty & MBX_DIRTY_QUOTA))
            continue;
        conf = ents[i].mb->conf;
        r = quota_shared(conf, &q);
        if (r) {
            log_error("mailbox: quota database unavailable mailbox=<%s> "
                      "error=<%s>", ents[i].mb->name, store_strerror(r));
            return;
        }
        k = 0;
        for (j = i; j < ne; j++) {
            struct mailbox *mb = ents[j].mb;

            ents[j].in_push = 0;
            if (ents[j].lock_r != STORE_OK || ents[j].told ||
                mb->conf != conf || !(mb->slot.dirty & MBX_DIRTY_QUOTA))
                continue;
            ents[j].told = 1;
            r = quota_findroot(q, mb->name, &root);
            if (r == STORE_NOTFOUND) {
                /* no root: nothing to tell */
                mb->slot.dirty &= ~MBX_DIRTY_QUOTA;
                (void)mbx_write_header(mb);
            } else if (r == STORE_OK) {
                names[k] = mb->name;
                bytes[k] = mb->slot.quota_used;
                msgs[k] = mb->slot.exists;
                k++;
                ents[j].in_push = 1;
            } else {
                log_error("mailbox: quota update failed mailbox=<%s> "
                          "error=<%s>", mb->name, store_strerror(r));
            }
        }
        r = k ? quota_update_many(q, names, bytes, msgs, k) : STORE_OK;
        for (j = i; j < ne; j++) {
            if (!ents[j].in_push)
                continue;
            ents[j].in_push = 0;
            if (r) {
                log_error("mailbox: quota update failed mailbox=<%s> "
                          "error=<%s>", ents[j].mb->name, store_strerror(r));
                continue;
            }
            ents[j].mb->slot.dirty &= ~MBX_DIRTY_QUOTA;
            (void)mbx_write_header(ents[j].mb);
        }
    }
    buf_free(&root);
}

int mailbox_append_finish_many(struct mailbox **mbs, const uint32_t *uids,
                               size_t n, int *results_r)
{
    struct mbx_many *ents = NULL;
    const char **names = NULL;
    uint64_t *bytes = NULL, *msgs = NULL;
    size_t i, j, ne = 0;
    int r, changed, first = STORE_OK;

    if (n == 0)
        return STORE_OK;
    if (!mbs || !uids) {
        for (i = 0; results_r && i < n; i++)
            results_r[i] = STORE_INTERNAL;
        return STORE_INTERNAL;
    }
    ents = calloc(n, sizeof(*ents));
    names = calloc(n, sizeof(*names));
    bytes = calloc(n, sizeof(*bytes));
    msgs = calloc(n, sizeof(*msgs));
    if (!ents || !names || !bytes || !msgs) {
        /* no memory to batch: finish one by one */
        for (i = 0; i < n; i++) {
            r = mailbox_append_finish(mbs[i], uids[i]);
            if (results_r)
                results_r[i] = r;
            if (r && first == STORE_OK)
                first = r;
        }
        goto out;
    }

    /* the distinct usable handles, in index path order */
    for (i = 0; i < n; i++) {
        struct mailbox *mb = mbs[i];

        if (!mb || mb->pid != procid_get() || mb->locktype)
            continue;
        for (j = 0; j < ne && ents[j].mb != mb; j++)
            ;
        if (j == ne)
            ents[ne++].mb = mb;
    }
    qsort(ents, ne, sizeof(*ents), mbx_cmp_many);

    /* every lock, in that order (see "LOCK ORDER" at the top); no quota
     * push per mailbox: a push a dead process left undone (bit 2) joins
     * the one below */
    for (j = 0; j < ne; j++)
        ents[j].lock_r = mbx_lock(ents[j].mb, MAILBOX_LOCK_EXCLUSIVE);

    /* finish every uid, in the caller's order */
    for (i = 0; i < n; i++) {
        struct mailbox *mb = mbs[i];

        for (j = 0; j < ne && ents[j].mb != mb; j++)
            ;
        if (j == ne)
            r = STORE_INTERNAL;
        else if (ents[j].lock_r != STORE_OK)
            r = ents[j].lock_r;
        else {
            r = mbx_resolve_locked(mb, uids[i], 1, &changed);
            if (r == STORE_OK && changed)
                r = mbx_write_header(mb);
            if (r) {
                /* as if this finish had its own lock: the next uid starts
                 * from the header on disk */
                int rr = mbx_read_header(mb);

                if (rr) {
                    mbx_release(mb);
                    ents[j].lock_r = rr;
                }
            }
        }
        if (results_r)
            results_r[i] = r;
        if (r && first == STORE_OK)
            first = r;
    }

    /* quota for all of them at once, still under every lock: two
     * processes never report one mailbox out of order */
    mbx_quota_settle_many(ents, ne, names, bytes, msgs);

    for (j = 0; j < ne; j++)
        if (ents[j].lock_r == STORE_OK)
            mbx_release(ents[j].mb);

out:
    free(ents);
    free(names);
    free(bytes);
    free(msgs);
    return first;
}

int mailbox_append_cancel(struct mailbox *mb, uint32_t uid)
{
    return mbx_resolve_pending(mb, uid, 0);
}

/* ---------------------------------------------------------------------- */
/* check and reconstruct                                                  */

int mailbox_check(struct mailbox *mb, struct buf *problem)
{
    struct buf path = BUF_INITIALIZER, dummy = BUF_INITIALIZER;
    struct mailbox_record rec;
    struct mbx_slot s;
    struct stat sb;
    uint32_t i, exists = 0, prev = 0;
    uint64_t used = 0;
    int took = 0, cur, bad = 0, r;

    if (!problem)
        problem = &dummy;
    buf_reset(problem);
    if (!mb)
        return STORE_INTERNAL;
    if (!mb->locktype) {
        r = mbx_lock(mb, MAILBOX_LOCK_SHARED);
        if (r) {
            buf_printf(problem, "cannot lock the index: %s",
                       store_strerror(r));
            buf_free(&dummy);
            return r;
        }
        took = 1;
    }
    r = mbx_read_slots(mb->fd, &s, &cur, &bad);
    if (r) {
        buf_printf(problem, "no valid index header slot");
        goto out;
    }
    if (bad) {
        buf_printf(problem, "index header slot %d fails its checksum",
                   (bad & 1) ? 0 : 1);
        r = STORE_CORRUPT;
        goto out;
    }
    if (s.visible > s.num_records || s.synced > s.visible ||
        s.uidnext == 0) {
        buf_printf(problem, "index header inconsistent: records=%u "
                   "visible=%u synced=%u uidnext=%u", s.num_records,
                   s.visible, s.synced, s.uidnext);
        r = STORE_CORRUPT;
        goto out;
    }
    if (fs_fstat_id(mb->fd, &sb) < 0) {
        r = STORE_IOERROR;
        goto out;
    }
    if ((uint64_t)sb.st_size < (uint64_t)mbx_rec_offset(s.num_records)) {
        buf_printf(problem, "index holds fewer records than its header "
                   "counts (%u)", s.num_records);
        r = STORE_CORRUPT;
        goto out;
    }
    for (i = 0; i < s.num_records; i++) {
        r = mbx_read_rec(mb, i, &rec);
        if (r) {
            buf_printf(problem, "record %u: %s", i,
                       r == STORE_CORRUPT ? "checksum mismatch"
                                          : store_strerror(r));
            if (r == STORE_NOTFOUND)
                r = STORE_CORRUPT;
            goto out;
        }
        if (rec.uid <= prev || rec.uid >= s.uidnext) {
            buf_printf(problem, "record %u: uid %u out of order (previous "
                       "%u, uidnext %u)", i, rec.uid, prev, s.uidnext);
            r = STORE_CORRUPT;
            goto out;
        }
        prev = rec.uid;
        if (i >= s.visible)
            continue;
        if ((rec.flags & MAILBOX_FLAG_PENDING) && i < s.synced) {
            buf_printf(problem, "record %u: uid %u pending inside the "
                       "durable prefix", i, rec.uid);
            r = STORE_CORRUPT;
            goto out;
        }
        if (rec.modseq > s.highestmodseq) {
            buf_printf(problem, "record %u: modseq %llu above the highest "
                       "%llu", i, (unsigned long long)rec.modseq,
                       (unsigned long long)s.highestmodseq);
            r = STORE_CORRUPT;
            goto out;
        }
        if (rec.flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
            continue;
        exists++;
        used += rec.size;
        mailbox_message_path(mb, rec.uid, &path);
        if (stat(buf_cstring(&path), &sb) < 0) {
            buf_printf(problem, "uid %u: message file missing", rec.uid);
            r = STORE_CORRUPT;
            goto out;
        }
        if ((uint64_t)sb.st_size != rec.size) {
            buf_printf(problem, "uid %u: file size %llu, record says %u",
                       rec.uid, (unsigned long long)sb.st_size, rec.size);
            r = STORE_CORRUPT;
            goto out;
        }
    }
    if (!(s.dirty & MBX_DIRTY_RECORDS) &&
        (exists != s.exists || used != s.quota_used)) {
        buf_printf(problem, "counters: header says %u messages / %llu bytes, "
                   "records %u / %llu", s.exists,
                   (unsigned long long)s.quota_used, exists,
                   (unsigned long long)used);
        r = STORE_CORRUPT;
        goto out;
    }
    r = STORE_OK;
out:
    if (took)
        mbx_release(mb);
    buf_free(&path);
    buf_free(&dummy);
    return r;
}

static int mbx_cmp_rec_uid(const void *a, const void *b)
{
    const struct mailbox_record *x = a, *y = b;

    return x->uid < y->uid ? -1 : x->uid > y->uid;
}

static int mbx_cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;

    return x < y ? -1 : x > y;
}

static int mbx_cmp_known(const void *a, const void *b)
{
    const struct mailbox_known *x = a, *y = b;

    return x->uid < y->uid ? -1 : x->uid > y->uid;
}

/* Is the file (size, digest) verified complete for uid: the old index's
 * intact record for it or a known message says these bytes? */
static int mbx_verified(const struct mailbox_record *old,
                        const struct mailbox_known *known, size_t nknown,
                        const struct mailbox_record *nr)
{
    size_t lo = 0, hi = nknown;

    if (old && old->size == nr->size &&
        !memcmp(old->digest, nr->digest, MAILBOX_DIGEST_LEN))
        return 1;
    while (lo < hi) {   /* known is sorted by uid; a uid may repeat */
        size_t mid = lo + (hi - lo) / 2;

        if (known[mid].uid < nr->uid)
            lo = mid + 1;
        else
            hi = mid;
    }
    for (; lo < nknown && known[lo].uid == nr->uid; lo++)
        if (known[lo].size == nr->size &&
            !memcmp(known[lo].digest, nr->digest, MAILBOX_DIGEST_LEN))
            return 1;
    return 0;
}

static int mbx_reconstruct(const struct imapconf *conf, const char *name,
                           const char *partition, const char *uniqueid,
                           int verify, struct mailbox_known *known,
                           size_t nknown, struct buf *report_r);

int mailbox_reconstruct(const struct imapconf *conf, const char *name,
                        const char *partition, const char *uniqueid,
                        struct buf *report_r)
{
    return mbx_reconstruct(conf, name, partition, uniqueid, 0, NULL, 0,
                           report_r);
}

int mailbox_reconstruct_verified(const struct imapconf *conf,
                                 const char *name, const char *partition,
                                 const struct mailbox_known *known,
                                 size_t nknown, struct buf *report_r)
{
    struct mailbox_known *k = NULL;
    int r;

    if (nknown) {
        k = malloc(nknown * sizeof(*k));
        if (!k)
            return STORE_NOMEM;
        memcpy(k, known, nknown * sizeof(*k));
        qsort(k, nknown, sizeof(*k), mbx_cmp_known);
    }
    r = mbx_reconstruct(conf, name, partition, NULL, 1, k, nknown, report_r);
    free(k);
    return r;
}

static int mbx_reconstruct(const struct imapconf *conf, const char *name,
                           const char *partition, const char *uniqueid,
                           int verify, struct mailbox_known *known,
                           size_t nknown, struct buf *report_r)
{
    struct buf dir = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct buf tmp = BUF_INITIALIZER;
    struct mailbox tmpmb, *mb = NULL, *reg;
    struct mailbox_record *olds = NULL, *recs = NULL;
    struct mbx_slot os, ns;
    uint32_t *uids = NULL, nold = 0, nuids = 0, alloc = 0, i, j, n = 0;
    uint32_t dropped = 0, added = 0, maxuid = 0, unverified = 0;
    uint64_t maxmod = 0;
    int have_old = 0, took_lock = 0, cur, nfd = -1, r;
    DIR *d = NULL;
    struct dirent *de;
    struct stat sb;
    pid_t pid = procid_get();

    if (report_r)
        buf_reset(report_r);
    memset(&tmpmb, 0, sizeof(tmpmb));
    tmpmb.fd = -1;
    r = mbx_resolve(conf, name, partition, &partition, NULL, &dir);
    if (r)
        goto out;
    if (stat(buf_cstring(&dir), &sb) < 0 || !S_ISDIR(sb.st_mode)) {
        r = STORE_NOTFOUND;
        goto out;
    }
    if (!mbx_uniqueid_ok(uniqueid)) {
        r = STORE_BADNAME;
        goto out;
    }

    /* the handle to work through: this process's, or a temporary one */
    buf_printf(&path, "%s/%s", buf_cstring(&dir), MAILBOX_INDEX_FNAME);
    reg = mbx_registry_find(pid, buf_cstring(&path));
    if (reg) {
        mb = reg;
        if (mb->locktype == MAILBOX_LOCK_SHARED) {
            r = STORE_INTERNAL;
            goto out;
        }
    } else {
        mb = &tmpmb;
        mb->conf = conf;
        mb->pid = pid;
        mb->name = strdup(name);
        mb->partition = strdup(partition);
        mb->dir = strdup(buf_cstring(&dir));
        mb->index_path = strdup(buf_cstring(&path));
        buf_reset(&path);
        buf_printf(&path, "%s/%s", buf_cstring(&dir), MAILBOX_HEADER_FNAME);
        mb->header_path = strdup(buf_cstring(&path));
        if (!mb->name || !mb->partition || !mb->dir || !mb->index_path ||
            !mb->header_path) {
            r = STORE_NOMEM;
            goto out;
        }
        mb->fd = open(mb->index_path, O_RDWR | O_CLOEXEC);
        if (mb->fd < 0 && errno != ENOENT) {
            r = STORE_IOERROR;
            goto out;
        }
        mbx_note_inode(mb);
    }
    if (mb->fd >= 0 && mb->locktype != MAILBOX_LOCK_EXCLUSIVE) {
        r = mbx_lock_fd(mb, F_WRLCK);
        if (r == STORE_NOTFOUND) {
            /* the index went away meanwhile: build from nothing */
            close(mb->fd);
            mb->fd = -1;
            mbx_note_inode(mb);
            r = STORE_OK;
        } else if (r) {
            goto out;
        } else {
            took_lock = 1;
        }
    }

    /* what survives of the old index */
    memset(&os, 0, sizeof(os));
    if (mb->fd >= 0) {
        have_old = mbx_read_slots(mb->fd, &os, &cur, NULL) == STORE_OK;
        if (fs_fstat_id(mb->fd, &sb) == 0 && sb.st_size > MBX_HDR_AREA) {
            uint64_t cnt = ((uint64_t)sb.st_size - MBX_HDR_AREA) / MBX_REC_SIZE;
            unsigned char p[MBX_REC_SIZE];

            if (cnt > UINT32_MAX)
                cnt = UINT32_MAX;
            olds = calloc(cnt ? cnt : 1, sizeof(*olds));
            if (!olds) {
                r = STORE_NOMEM;
                goto out;
            }
            for (i = 0; i < cnt; i++) {
                if (fs_pread_all(mb->fd, p, sizeof(p), mbx_rec_offset(i)) < 0)
                    break;
                if (mbx_rec_decode(p, &olds[nold]) == 0 && olds[nold].uid)
                    nold++;
                else
                    dropped++;   /* damaged: counted as dropped */
            }
            qsort(olds, nold, sizeof(*olds), mbx_cmp_rec_uid);
        }
    }

    if (verify && !have_old)
        log_warning("mailbox: reconstruct cannot verify the files, no "
                    "readable index header mailbox=<%s>", name);

    /* the message files */
    d = opendir(buf_cstring(&dir));
    if (!d) {
        r = mbx_errno(errno);
        goto out;
    }
    while ((de = readdir(d)) != NULL) {
        uint32_t uid;

        if (!mbx_parse_msgname(de->d_name, &uid))
            continue;
        if (nuids == alloc) {
            uint32_t na = alloc ? alloc * 2 : 64;
            uint32_t *nu = realloc(uids, (size_t)na * sizeof(*nu));

            if (!nu) {
                r = STORE_NOMEM;
                goto out;
            }
            uids = nu;
            alloc = na;
        }
        uids[nuids++] = uid;
    }
    closedir(d);
    d = NULL;
    qsort(uids, nuids, sizeof(*uids), mbx_cmp_u32);
    recs = calloc(nuids ? nuids : 1, sizeof(*recs));
    if (!recs) {
        r = STORE_NOMEM;
        goto out;
    }
    for (i = 0; i < nuids; i++) {
        struct mailbox_record *nr = &recs[n], key, *old;
        uint64_t size;
        int fd;

        buf_reset(&path);
        buf_printf(&path, "%s/%u.", buf_cstring(&dir), uids[i]);
        fd = open(buf_cstring(&path), O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            continue;
        if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode) ||
            (uint64_t)sb.st_size > UINT32_MAX) {
            close(fd);
            log_warning("mailbox: reconstruct skips file=<%s>",
                        buf_cstring(&path));
            continue;
        }
        memset(nr, 0, sizeof(*nr));
        r = mbx_scan_file(fd, &size, &nr->header_size, nr->digest);
        close(fd);
        if (r)
            goto out;
        nr->uid = uids[i];
        nr->size = (uint32_t)size;
        nr->internaldate = (int64_t)sb.st_mtime;
        nr->last_updated = (int64_t)time(NULL);
        key.uid = uids[i];
        old = nold ? bsearch(&key, olds, nold, sizeof(*olds),
                             mbx_cmp_rec_uid) : NULL;
        if (verify && have_old && !mbx_verified(old, known, nknown, nr)) {
            /* a torn or partial write of a delivery never acknowledged:
             * nothing durable says these bytes are a message */
            log_warning("mailbox: reconstruct drops unverified file=<%s> "
                        "size=<%u>", buf_cstring(&path), nr->size);
            if (unlink(buf_cstring(&path)) < 0 && errno != ENOENT) {
                r = mbx_errno(errno);
                goto out;
            }
            unverified++;
            continue;
        }
        if (old && old->size == nr->size &&
            !memcmp(old->digest, nr->digest, MAILBOX_DIGEST_LEN)) {
            nr->flags = old->flags & ~MAILBOX_FLAG_PENDING;
            memcpy(nr->user_flags, old->user_flags, sizeof(nr->user_flags));
            nr->modseq = old->modseq;
            nr->internaldate = old->internaldate;
            nr->last_updated = old->last_updated;
            if (nr->modseq > maxmod)
                maxmod = nr->modseq;
        } else {
            added++;
        }
        maxuid = uids[i];
        n++;
    }
    /* old records without a file */
    for (i = 0, j = 0; i < nold; i++) {
        while (j < n && recs[j].uid < olds[i].uid)
            j++;
        if (j >= n || recs[j].uid != olds[i].uid)
            dropped++;
    }

    memset(&ns, 0, sizeof(ns));
    if (have_old && os.uidvalidity) {
        ns.uidvalidity = os.uidvalidity;
    } else {
        r = mbx_next_uidvalidity(conf, &ns.uidvalidity);
        if (r)
            goto out;
    }
    ns.uidnext = have_old ? os.uidnext : 1;
    if (ns.uidnext <= maxuid)
        ns.uidnext = maxuid + 1;
    ns.highestmodseq = have_old && os.highestmodseq > maxmod ? os.highestmodseq
                                                             : maxmod;
    ns.last_appenddate = have_old ? os.last_appenddate : 0;
    ns.compactions = have_old ? os.compactions + 1 : 0;
    ns.generation = (have_old ? os.generation : 0) + 2;
    for (i = 0; i < n; i++) {
        if (recs[i].modseq == 0)
            recs[i].modseq = ++ns.highestmodseq;
        if (recs[i].flags & (MAILBOX_FLAG_EXPUNGED | MAILBOX_FLAG_ABORTED))
            continue;
        ns.exists++;
        ns.quota_used += recs[i].size;
        if (recs[i].internaldate > ns.last_appenddate && !have_old)
            ns.last_appenddate = recs[i].internaldate;
    }
    ns.num_records = ns.visible = ns.synced = n;
    ns.dirty = MBX_DIRTY_QUOTA;
    /* records may have been lost: no expunge before now is listed */
    ns.deletedmodseq = ns.highestmodseq;

    buf_printf(&tmp, "%s.NEW.%ld", mb->index_path, (long)pid);
    r = mbx_write_new_index(buf_cstring(&tmp), &ns, recs, n, &nfd);
    if (r)
        goto out;
    if (mb->fd >= 0) {
        r = mbx_install_index(mb, buf_cstring(&tmp), nfd);
    } else {
        if (rename(buf_cstring(&tmp), mb->index_path) < 0) {
            r = mbx_errno(errno);
            close(nfd);
            unlink(buf_cstring(&tmp));
            goto out;
        }
        r = fs_fsync_dir(mb->dir) < 0 ? mbx_errno(errno) : STORE_OK;
        mb->fd = nfd;
        mbx_note_inode(mb);
    }
    nfd = -1;
    mb->slot = ns;
    mb->cur_slot = 0;
    mbx_publish(mb);
    for (i = 0; i < mb->npending; i++)
        mb->pending[i].visible_at_reserve = 0;
    if (r)
        goto out;

    /* cyrus.header: keep it when it parses (with its flags) */
    if (mbx_load_header_file(mb) != STORE_OK ||
        (uniqueid && strcmp(uniqueid, mb->uniqueid ? mb->uniqueid : ""))) {
        r = mbx_write_header_file(mb->header_path, mb->dir, name,
                                  uniqueid ? uniqueid : mb->uniqueid,
                                  mb->flags);
        if (r)
            goto out;
        mb->hdr_ino = 0;
        (void)mbx_refresh_header_file(mb);
    }

    mbx_quota_settle(mb);
    if (unverified && fs_fsync_dir(mb->dir) < 0) {
        r = mbx_errno(errno);
        goto out;
    }
    log_info("mailbox: reconstructed mailbox=<%s> messages=<%u> "
             "dropped=<%u> added=<%u> unverified=<%u>", name, n, dropped,
             added, unverified);
    if (report_r)
        buf_printf(report_r, "%u messages, %u records dropped, %u files added",
                   n, dropped, added);

out:
    if (d)
        closedir(d);
    if (nfd >= 0)
        close(nfd);
    if (mb == &tmpmb) {
        if (!mbx_registry_has_own())
            quota_shared_close();
        if (tmpmb.fd >= 0)
            close(tmpmb.fd);   /* drops the lock */
        tmpmb.fd = -1;
        free(tmpmb.name);
        free(tmpmb.partition);
        free(tmpmb.uniqueid);
        free(tmpmb.dir);
        free(tmpmb.index_path);
        free(tmpmb.header_path);
        mbx_free_flags(tmpmb.flags);
    } else if (mb && took_lock) {
        mbx_fcntl(mb->fd, F_SETLK, F_UNLCK, 0, 1);
    }
    free(olds);
    free(recs);
    free(uids);
    buf_free(&dir);
    buf_free(&path);
    buf_free(&tmp);
    return r;
}
