/*
 * skiplist.c - the skiplist storage engine (Cyrus "skiplist file" 1.2).
 *
 * FORMAT.  Every number is a 4-byte big-endian unsigned integer; every
 * offset is from the start of the file; keys and values are padded with
 * zero bytes to a multiple of 4.
 *
 *   header (48 bytes)
 *     0  magic "\241\002\213\015skiplist file\0\0\0" (20 bytes)
 *    20  version (1)          24  minor version (2)
 *    28  maxlevel (20)        32  curlevel (highest level in use)
 *    36  listsize (records at the last checkpoint or recovery)
 *    40  logstart (end of the checkpointed part, where the log begins)
 *    44  last recovery (seconds since the epoch; checkpoint or recovery)
 *   48  DUMMY node: 257, keylen 0, datalen 0, maxlevel forward pointers, -1
 *   then records:
 *     INORDER (1) / ADD (2): type, keylen, key, datalen, value,
 *         level forward pointers (level 1..maxlevel), 0xFFFFFFFF
 *     DELETE (4): type, offset of the INORDER/ADD record it removes
 *     COMMIT (255): type
 *
 * The part up to logstart holds INORDER records in key order, written by a
 * checkpoint.  After it comes the log: ADD and DELETE records, each
 * transaction closed by a COMMIT.  Forward pointer i of a node is the
 * offset of the next node (in key order) whose level is > i, 0 at the end:
 * the file is a live skiplist.  A write appends its record at the end and
 * then rewrites the 4-byte forward pointers of its predecessors in place
 * (a replacement is a DELETE of the old node and an ADD with the same level
 * and forward pointers).  Readers search by following the pointers in a
 * read-only shared map.
 *
 * KEY ORDER (skiplist_cmp) is the file's, everywhere in this engine: search,
 * insert, seek, consistent(), and the sort of recovery and checkpoint.
 * Without SKIPLIST_MBOXSORT it is Cyrus's order, bytes compared as signed
 * chars (0x80..0xff before 0x00..0x7f), so Cyrus and this engine read and
 * extend each other's files whatever the keys hold.  That is not the API's
 * cyrusdb_compare() order for keys with bytes >= 0x80
 * (skiplist_key_reorders()); the adapter re-sorts such ranges for its
 * walks, and dump detail 0 prints in API order.  With SKIPLIST_MBOXSORT the
 * order is cyrusdb_compare(CYRUSDB_MBOXSORT), which matches Cyrus's
 * mailbox order on keys without bytes 0x00..0x0a (skiplist.h).
 *
 * Records read from the map are never trusted: every offset and length is
 * checked against the file size, levels against maxlevel, and every step
 * of a search must reach a strictly greater key, so damage yields
 * SKIPLIST_IOERROR (with a log line), never a crash, a wrong answer from a
 * pointer loop, or a hang.
 *
 * COMMIT ORDER.  A transaction appends its records and updates pointers,
 * then (1) fdatasync, (2) appends the 4-byte COMMIT record, (3) fdatasync.
 * A COMMIT that is on disk was written after every byte of its transaction
 * was durable, so a COMMIT found in the file vouches for the records before
 * it; anything after the last COMMIT is an unfinished transaction.  The
 * pointers are a cache of the order: the records alone determine the
 * contents, and recovery rebuilds everything from them.
 *
 * WHY A CRASH IS SAFE.
 *   - Process killed inside a transaction (the kernel keeps every write):
 *     a pointer is only changed after the record that justifies it was
 *     appended, so the file has bytes after its last COMMIT.  Whoever takes
 *     the lock next parses the bytes appended since it last looked (each
 *     handle remembers how far the file is known to end in a COMMIT) and
 *     finds them.  A writer holds the exclusive lock and recovers at once;
 *     a reader cannot write under its shared lock, so it answers from an
 *     in-memory replay of the committed records (it never follows the
 *     pointers, which may point into the dead transaction) until a writer
 *     recovers the file.  A change to the header's curlevel alone is
 *     harmless: the levels above hold null pointers.
 *   - Power loss: the in-place pointer writes of an unfinished transaction
 *     may reach the disk without its records, which no tail check can see.
 *     Such a file has "last recovery" older than the system's boot time,
 *     and a writable open then recovers it first (read-only handles use the
 *     replay); this is Cyrus's skipstamp rule with the boot time as stamp.
 *   - Recovery and checkpoint never modify the old file: they replay the
 *     checkpointed part and every committed transaction of the log into the
 *     live record set (a record's key decides what a DELETE removes), write
 *     it in key order into "<file>.NEW", fsync it, take its lock, rename it
 *     over the file, and fsync the directory.  A crash before the rename
 *     leaves the old file (still needing recovery, so it is redone); after
 *     it, the new complete file.  Other processes see the inode change when
 *     they next take a lock and reopen the file.
 *   - Abort undoes the pointer changes record by record (newest first) and
 *     truncates the tail; a crash in between still leaves the tail.
 *   - SKIPLIST_NOSYNC (the duplicate database, whose records may be lost)
 *     drops steps (1) and (3) of the commit order.  Everything above about
 *     killed processes still holds: the kernel keeps every write, in
 *     order, for every process.  A crash of the machine may write the
 *     pages out in any order, so a COMMIT may reach the disk before the
 *     records it vouches for; the boot-time rule makes the next writable
 *     open recover, and that recovery either replays the records that did
 *     reach the disk or, where what it reads does not parse (zeroed or
 *     missing blocks), reports the file damaged (SKIPLIST_IOERROR); losing
 *     the last commits or the file is what the flag accepts.  Checkpoint
 *     and recovery rewrites keep all their syncs (the new file before the
 *     rename, the directory after it): they are rare (the log must double
 *     first), and a rename of an unsynced file could replace the whole
 *     database by an empty one.  So do the header write and directory sync
 *     of a newly created file (once per file).
 *   - SKIPLIST_ORDERED (the seen state: consistent, its last moments may
 *     be lost) drops step (3) only.  Step (1) still makes every record of
 *     the transaction, and everything before it in the file (the earlier
 *     COMMITs included), durable before the COMMIT is appended, so a
 *     COMMIT that reaches the disk still vouches for its records; a
 *     COMMIT that does not leaves an unfinished transaction, which the
 *     boot-time rule makes the next writable open drop: the file is never
 *     damaged, only the last commits are lost (each whole, in order).
 * Checkpoint runs after a commit when the file has grown past twice the
 * checkpointed part plus 16 KiB (unless SKIPLIST_NOCOMPACT), which bounds
 * the log a recovery replays.
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "cyrusdb/cyrusdb.h"
#include "cyrusdb/skiplist.h"
#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/log.h"

enum {
    SKIPLIST_T_INORDER = 1,
    SKIPLIST_T_ADD = 2,
    SKIPLIST_T_DELETE = 4,
    SKIPLIST_T_COMMIT = 255,
    SKIPLIST_T_DUMMY = 257
};

#define SKIPLIST_VERSION 1
#define SKIPLIST_VERSION_MINOR 2
#define SKIPLIST_MAXLEVEL 20
#define SKIPLIST_HEADER_SIZE 48
#define SKIPLIST_DUMMY_OFFSET 48
#define SKIPLIST_OFF_VERSION 20
#define SKIPLIST_OFF_VERSION_MINOR 24
#define SKIPLIST_OFF_MAXLEVEL 28
#define SKIPLIST_OFF_CURLEVEL 32
#define SKIPLIST_OFF_LISTSIZE 36
#define SKIPLIST_OFF_LOGSTART 40
#define SKIPLIST_OFF_LASTRECOVERY 44
#define SKIPLIST_PAD 0xFFFFFFFFu
#define SKIPLIST_MINREWRITE 16384
#define SKIPLIST_MAXFILE ((uint64_t)UINT32_MAX - 8)

#define SKIPLIST_DUMMY_SIZE(ml) (4u * (3u + (uint32_t)(ml) + 1u))
#define SKIPLIST_ROUNDUP(n) (((uint64_t)(n) + 3) & ~(uint64_t)3)

/* A parsed INORDER / ADD / DUMMY node. */
struct skiplist_node {
    uint32_t off;
    uint32_t type;
    uint32_t keylen;
    uint32_t datalen;
    uint32_t level;
    uint32_t size;       /* bytes of the whole record */
    uint32_t fwdpos;     /* file offset of forward pointer 0 */
    const char *key;
    const char *data;
};

/* One entry of a replay: a record that sets (del == 0) or removes a key. */
struct skiplist_op {
    const char *key;
    uint32_t keylen;
    uint32_t off;
    uint32_t del;
};

struct skiplist {
    char *fname;
    int fd;
    int flags;

    /* the map: read-only, shared, longer than the file so that appends
     * rarely need a new one; only [0, size) is ever read */
    char *map;
    size_t map_len;
    size_t size;
    dev_t dev;
    ino_t ino;
    uint64_t gen;            /* bumped whenever the contents may change */

    /* the file fd is open on, once an fstat() told (fd_known); cleared
     * whenever fd changes.  While fd stays open its inode cannot be
     * freed, so its number names no other file: a stat() of the path
     * that finds it proves the path still names our file, and its size
     * is our file's size (skiplist_refresh(), one system call) */
    int fd_known;
    dev_t fd_dev;
    ino_t fd_ino;

    /* header */
    uint32_t maxlevel;
    uint32_t curlevel;
    uint32_t listsize;
    uint32_t logstart;
    uint32_t last_recovery;

    /* locks: F_UNLCK, F_RDLCK or F_WRLCK; depth counts nested read holds */
    int lock;
    unsigned depth;

    /* the file is known to end in a COMMIT (or at logstart) up to here */
    size_t valid_end;
    size_t warned_end;       /* tail already reported (once per tail) */
    int needs_recovery;

    /* replay view: the live records in key order, used instead of the
     * pointers while the file awaits a recovery we may not run */
    int use_view;
    uint32_t *view;
    size_t view_count;
    uint64_t view_gen;

    /* the last record seek() returned, to step on without a search */
    uint32_t cursor_off;
    uint64_t cursor_gen;

    /* the write transaction */
    int in_txn;
    int txn_failed;
    uint32_t txn_start;
    uint32_t txn_end;
    uint32_t txn_curlevel;
    uint32_t *txn_recs;      /* offsets of the records it appended */
    size_t txn_nrecs;
    size_t txn_alloc;

    uint64_t rng;
    struct buf wbuf;
};

/* ---- small helpers --------------------------------------------------- */

static inline uint32_t skiplist_get32(const char *p)
{
    const unsigned char *u = (const unsigned char *)p;

    return ((uint32_t)u[0] << 24) | ((uint32_t)u[1] << 16) |
           ((uint32_t)u[2] << 8) | (uint32_t)u[3];
}

static inline void skiplist_put32(char *p, uint32_t v)
{
    unsigned char *u = (unsigned char *)p;

    u[0] = (unsigned char)(v >> 24);
    u[1] = (unsigned char)(v >> 16);
    u[2] = (unsigned char)(v >> 8);
    u[3] = (unsigned char)v;
}

static int skiplist_buf_put32(struct buf *b, uint32_t v)
{
    char w[4];

    skiplist_put32(w, v);
    return buf_append(b, w, 4);
}

static int skiplist_buf_padded(struct buf *b, const char *s, size_t len)
{
    static const char zeros[4] = { 0, 0, 0, 0 };

    if (len && buf_append(b, s, len) < 0)
        return -1;
    return buf_append(b, zeros, (size_t)(SKIPLIST_ROUNDUP(len) - len));
}

/*
 * The file's key order.  Without SKIPLIST_MBOXSORT it is Cyrus's: bytes
 * compared as signed chars (0x80..0xff below 0x00..0x7f), a key before the
 * longer keys it is a prefix of.  With SKIPLIST_MBOXSORT it is
 * cyrusdb_compare(CYRUSDB_MBOXSORT) (see skiplist.h for how that relates to
 * Cyrus's mailbox order).  Equality is byte equality either way.
 */
static int skiplist_cmp(const struct skiplist *sl, const char *a, size_t alen,
                        const char *b, size_t blen)
{
    size_t n = alen < blen ? alen : blen, i;

    if (sl->flags & SKIPLIST_MBOXSORT)
        return cyrusdb_compare(CYRUSDB_MBOXSORT, a, alen, b, blen);
    for (i = 0; i < n; i++) {
        int ca = (signed char)a[i], cb = (signed char)b[i];

        if (ca != cb)
            return ca < cb ? -1 : 1;
    }
    if (alen == blen)
        return 0;
    return alen < blen ? -1 : 1;
}

int skiplist_key_reorders(const struct skiplist *sl, const char *key, size_t keylen)
{
    size_t i;

    if (sl->flags & SKIPLIST_MBOXSORT)
        return 0;
    for (i = 0; i < keylen; i++)
        if ((unsigned char)key[i] >= 0x80)
            return 1;
    return 0;
}

static uint32_t skiplist_dummy_end(const struct skiplist *sl)
{
    return SKIPLIST_DUMMY_OFFSET + SKIPLIST_DUMMY_SIZE(sl->maxlevel);
}

/* Log structural damage and return IOERROR. */
static int skiplist_damaged(const struct skiplist *sl, uint64_t off, const char *what)
{
    log_error("skiplist: damaged file file=<%s> offset=<%llu> error=<%s>",
              sl->fname, (unsigned long long)off, what);
    return SKIPLIST_IOERROR;
}

/* Log a failed system call (errno) and return FULL or IOERROR. */
static int skiplist_syserr(const struct skiplist *sl, const char *what)
{
    int e = errno;

    log_error("skiplist: %s failed file=<%s> error=<%s>", what, sl->fname, strerror(e));
    errno = e;
    return (e == ENOSPC || e == EDQUOT) ? SKIPLIST_FULL : SKIPLIST_IOERROR;
}

/* Boot time of the system, or 0 when unknown; computed once. */
static time_t skiplist_boot_time(void)
{
    static time_t boot = -1;
    char line[256];
    FILE *f;

    if (boot != -1)
        return boot;
    boot = 0;
    f = fopen("/proc/stat", "re");
    if (f) {
        while (fgets(line, sizeof(line), f)) {
            if (!strncmp(line, "btime ", 6)) {
                boot = (time_t)strtoll(line + 6, NULL, 10);
                break;
            }
        }
        fclose(f);
    }
#ifdef CLOCK_BOOTTIME
    if (boot <= 0) {
        struct timespec up;

        if (clock_gettime(CLOCK_BOOTTIME, &up) == 0)
            boot = time(NULL) - up.tv_sec - 1;
    }
#endif
    if (boot < 0)
        boot = 0;
    return boot;
}

/* Random level with p = 0.5 per extra level, at most maxlevel. */
static uint32_t skiplist_random_level(struct skiplist *sl)
{
    uint64_t x = sl->rng;
    uint32_t lvl = 1;

    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    sl->rng = x;
    x *= 0x2545F4914F6CDD1DULL;
    while ((x & 1) && lvl < sl->maxlevel) {
        lvl++;
        x >>= 1;
    }
    return lvl;
}

/* ---- parsing records (never trusting the file) ------------------------ */

/* Parse the INORDER, ADD or DUMMY node at off; -1 if it is not one that
 * lies wholly inside the file. */
static int skiplist_parse_node(const struct skiplist *sl, uint32_t off,
                               struct skiplist_node *n)
{
    const char *m = sl->map;
    uint64_t p;
    uint32_t w;

    if (off % 4 || off < SKIPLIST_DUMMY_OFFSET || (uint64_t)off + 16 > sl->size)
        return -1;
    n->off = off;
    n->type = skiplist_get32(m + off);
    if (n->type == SKIPLIST_T_DUMMY) {
        if (off != SKIPLIST_DUMMY_OFFSET)
            return -1;
    } else if (n->type != SKIPLIST_T_INORDER && n->type != SKIPLIST_T_ADD) {
        return -1;
    }
    n->keylen = skiplist_get32(m + off + 4);
    if (n->type != SKIPLIST_T_DUMMY && (n->keylen == 0 || n->keylen > SKIPLIST_MAX_KEYLEN))
        return -1;
    p = (uint64_t)off + 8 + SKIPLIST_ROUNDUP(n->keylen);
    if (p + 8 > sl->size)
        return -1;
    n->key = m + off + 8;
    n->datalen = skiplist_get32(m + p);
    if (n->datalen > SKIPLIST_MAX_DATALEN)
        return -1;
    n->data = m + p + 4;
    p += 4 + SKIPLIST_ROUNDUP(n->datalen);
    n->fwdpos = (uint32_t)p;
    n->level = 0;
    for (;;) {
        if (p + 4 > sl->size)
            return -1;
        w = skiplist_get32(m + p);
        if (w == SKIPLIST_PAD)
            break;
        if (++n->level > sl->maxlevel)
            return -1;
        p += 4;
    }
    if (n->level == 0)
        return -1;
    n->size = (uint32_t)(p + 4 - off);
    return 0;
}

static inline uint32_t skiplist_fwd(const struct skiplist *sl,
                                    const struct skiplist_node *n, uint32_t i)
{
    return skiplist_get32(sl->map + n->fwdpos + 4 * (size_t)i);
}

/* Parse one log record (ADD, DELETE, COMMIT); -1 if it is not whole. */
static int skiplist_parse_logrec(const struct skiplist *sl, uint32_t off,
                                 uint32_t *type_r, uint32_t *len_r)
{
    struct skiplist_node n;
    uint32_t type, target;

    if (off % 4 || (uint64_t)off + 4 > sl->size)
        return -1;
    type = skiplist_get32(sl->map + off);
    switch (type) {
    case SKIPLIST_T_COMMIT:
        *len_r = 4;
        break;
    case SKIPLIST_T_DELETE:
        if ((uint64_t)off + 8 > sl->size)
            return -1;
        target = skiplist_get32(sl->map + off + 4);
        if (target % 4 || target < skiplist_dummy_end(sl) || target >= off)
            return -1;
        *len_r = 8;
        break;
    case SKIPLIST_T_ADD:
        if (skiplist_parse_node(sl, off, &n) < 0)
            return -1;
        *len_r = n.size;
        break;
    default:
        return -1;
    }
    *type_r = type;
    return 0;
}

/* Offset just past the last COMMIT found walking the log from `start`. */
static uint32_t skiplist_scan_log(const struct skiplist *sl, uint32_t start)
{
    uint32_t off = start, commit_end = start, type, len;

    while (off < sl->size) {
        if (skiplist_parse_logrec(sl, off, &type, &len) < 0)
            break;
        off += len;
        if (type == SKIPLIST_T_COMMIT)
            commit_end = off;
    }
    return commit_end;
}

/* ---- map, header, refresh ------------------------------------------ */

static void skiplist_unmap(struct skiplist *sl)
{
    if (sl->map)
        munmap(sl->map, sl->map_len);
    sl->map = NULL;
    sl->map_len = 0;
}

static int skiplist_map_file(struct skiplist *sl)
{
    long pagesz = sysconf(_SC_PAGESIZE);
    size_t want;
    void *m;

    if (sl->size == 0 || (sl->map && sl->size <= sl->map_len))
        return SKIPLIST_OK;
    skiplist_unmap(sl);
    if (pagesz <= 0)
        pagesz = 4096;
    want = sl->size + sl->size / 4 + 65536;
    want = (want + (size_t)pagesz - 1) / (size_t)pagesz * (size_t)pagesz;
    m = mmap(NULL, want, PROT_READ, MAP_SHARED, sl->fd, 0);
    if (m == MAP_FAILED)
        return skiplist_syserr(sl, "mmap");
    sl->map = m;
    sl->map_len = want;
    sl->gen++;
    return SKIPLIST_OK;
}

static void skiplist_view_free(struct skiplist *sl)
{
    free(sl->view);
    sl->view = NULL;
    sl->view_count = 0;
    sl->use_view = 0;
}

static int skiplist_read_header(struct skiplist *sl)
{
    const char *m = sl->map;
    struct skiplist_node d;
    uint32_t version;

    if (sl->size < SKIPLIST_HEADER_SIZE)
        return skiplist_damaged(sl, sl->size, "file shorter than the header");
    if (memcmp(m, SKIPLIST_MAGIC, SKIPLIST_MAGIC_LEN) != 0) {
        log_error("skiplist: bad magic file=<%s>", sl->fname);
        return SKIPLIST_BADFORMAT;
    }
    version = skiplist_get32(m + SKIPLIST_OFF_VERSION);
    if (version != SKIPLIST_VERSION) {
        log_error("skiplist: unsupported version file=<%s> version=<%u.%u>",
                  sl->fname, version, skiplist_get32(m + SKIPLIST_OFF_VERSION_MINOR));
        return SKIPLIST_BADFORMAT;
    }
    sl->maxlevel = skiplist_get32(m + SKIPLIST_OFF_MAXLEVEL);
    sl->curlevel = skiplist_get32(m + SKIPLIST_OFF_CURLEVEL);
    sl->listsize = skiplist_get32(m + SKIPLIST_OFF_LISTSIZE);
    sl->logstart = skiplist_get32(m + SKIPLIST_OFF_LOGSTART);
    sl->last_recovery = skiplist_get32(m + SKIPLIST_OFF_LASTRECOVERY);
    if (sl->maxlevel < 1 || sl->maxlevel > SKIPLIST_MAXLEVEL) {
        sl->maxlevel = SKIPLIST_MAXLEVEL;
        return skiplist_damaged(sl, SKIPLIST_OFF_MAXLEVEL, "maxlevel out of range");
    }
    if (sl->curlevel > sl->maxlevel)
        return skiplist_damaged(sl, SKIPLIST_OFF_CURLEVEL, "curlevel above maxlevel");
    if (sl->curlevel == 0)
        sl->curlevel = 1;
    if (skiplist_parse_node(sl, SKIPLIST_DUMMY_OFFSET, &d) < 0 ||
        d.type != SKIPLIST_T_DUMMY || d.keylen != 0 || d.datalen != 0 ||
        d.level != sl->maxlevel)
        return skiplist_damaged(sl, SKIPLIST_DUMMY_OFFSET, "bad dummy node");
    return SKIPLIST_OK;
}

/* Open the file again after another process replaced it, locking the new
 * one like the old before letting the old one (and its lock) go. */
static int skiplist_reopen(struct skiplist *sl)
{
    int fd = open(sl->fname, ((sl->flags & SKIPLIST_RDONLY) ? O_RDONLY : O_RDWR) | O_CLOEXEC);

    if (fd < 0)
        return skiplist_syserr(sl, "reopen");
    if (fs_lock(fd, sl->lock, 1) < 0) {
        int r = errno == EDEADLK ? SKIPLIST_AGAIN : skiplist_syserr(sl, "lock");
        close(fd);
        return r;
    }
    close(sl->fd);
    sl->fd = fd;
    sl->fd_known = 0;
    return SKIPLIST_OK;
}

/*
 * With a lock just taken: follow a replaced file, map what has grown,
 * reread the header and check whether the file ends in a COMMIT.  Sets
 * needs_recovery; does not repair anything.
 */
static int skiplist_refresh(struct skiplist *sl)
{
    struct stat fst, st;
    uint32_t commit_end;
    int r;

    for (;;) {
        if (fs_stat_id(sl->fname, &st) < 0)
            return skiplist_syserr(sl, "stat");
        if (sl->fd_known && st.st_ino == sl->fd_ino &&
            st.st_dev == sl->fd_dev) {
            fst = st;   /* the same inode: the same size */
            break;
        }
        if (fs_fstat_id(sl->fd, &fst) < 0)
            return skiplist_syserr(sl, "fstat");
        sl->fd_known = 1;
        sl->fd_dev = fst.st_dev;
        sl->fd_ino = fst.st_ino;
        if (st.st_ino == fst.st_ino && st.st_dev == fst.st_dev) {
            fst = st;   /* the size as of the later call */
            break;
        }
        if ((r = skiplist_reopen(sl)) != SKIPLIST_OK)
            return r;
    }
    if (fst.st_ino != sl->ino || fst.st_dev != sl->dev) {
        skiplist_unmap(sl);
        skiplist_view_free(sl);
        sl->ino = fst.st_ino;
        sl->dev = fst.st_dev;
        sl->valid_end = 0;
        sl->warned_end = 0;
        sl->size = 0;
        sl->gen++;
    }
    if ((uint64_t)fst.st_size > SKIPLIST_MAXFILE)
        return skiplist_damaged(sl, (uint64_t)fst.st_size, "file larger than 4 GiB");
    if ((size_t)fst.st_size != sl->size)
        sl->gen++;
    sl->size = (size_t)fst.st_size;
    sl->needs_recovery = 0;
    if (sl->size == 0)
        return SKIPLIST_OK;
    if ((r = skiplist_map_file(sl)) != SKIPLIST_OK)
        return r;
    if ((r = skiplist_read_header(sl)) != SKIPLIST_OK)
        return r;

    if (sl->logstart < skiplist_dummy_end(sl) || sl->logstart > sl->size ||
        sl->logstart % 4) {
        log_warning("skiplist: bad logstart, recovery needed file=<%s> logstart=<%u> size=<%zu>",
                    sl->fname, sl->logstart, sl->size);
        sl->needs_recovery = 1;
        return SKIPLIST_OK;
    }
    if (sl->valid_end < sl->logstart || sl->valid_end > sl->size)
        sl->valid_end = sl->logstart;
    commit_end = skiplist_scan_log(sl, (uint32_t)sl->valid_end);
    if (commit_end != sl->size) {
        if (sl->warned_end != commit_end)
            log_warning("skiplist: uncommitted tail, recovery needed file=<%s> offset=<%u> bytes=<%zu>",
                        sl->fname, commit_end, sl->size - commit_end);
        sl->warned_end = commit_end;
        sl->valid_end = commit_end;
        sl->needs_recovery = 1;
        return SKIPLIST_OK;
    }
    sl->valid_end = sl->size;
    if ((time_t)sl->last_recovery < skiplist_boot_time()) {
        log_info("skiplist: not recovered since boot file=<%s> last_recovery=<%u>",
                 sl->fname, sl->last_recovery);
        sl->needs_recovery = 1;
    }
    return SKIPLIST_OK;
}

/* ---- replay: the committed contents, without the pointers ------------ */

/* Stable merge sort of ops by key. */
static void skiplist_sort_ops(const struct skiplist *sl, struct skiplist_op *ops,
                              struct skiplist_op *tmp, size_t n)
{
    size_t width, i;

    for (width = 1; width < n; width *= 2) {
        for (i = 0; i < n; i += 2 * width) {
            size_t lo = i, mid = i + width, hi = i + 2 * width, a, b, k;

            if (mid >= n) {
                memcpy(tmp + lo, ops + lo, (n - lo) * sizeof(*ops));
                continue;
            }
            if (hi > n)
                hi = n;
            for (a = lo, b = mid, k = lo; k < hi; k++) {
                if (a < mid && (b >= hi ||
                                skiplist_cmp(sl, ops[a].key, ops[a].keylen,
                                             ops[b].key, ops[b].keylen) <= 0))
                    tmp[k] = ops[a++];
                else
                    tmp[k] = ops[b++];
            }
        }
        memcpy(ops, tmp, n * sizeof(*ops));
    }
}

static int skiplist_push_op(struct skiplist_op **ops, size_t *n, size_t *alloc,
                            const struct skiplist_op *op)
{
    if (*n == *alloc) {
        size_t na = *alloc ? *alloc * 2 : 256;
        struct skiplist_op *p = realloc(*ops, na * sizeof(**ops));
        if (!p)
            return -1;
        *ops = p;
        *alloc = na;
    }
    (*ops)[(*n)++] = *op;
    return 0;
}

static int skiplist_offset_known(const struct skiplist_op *ops, size_t n, uint32_t off)
{
    size_t lo = 0, hi = n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ops[mid].off == off)
            return 1;
        if (ops[mid].off < off)
            lo = mid + 1;
        else
            hi = mid;
    }
    return 0;
}

/*
 * Compute the live records from the records alone: the checkpointed part,
 * then every committed transaction of the log.  *live_r gets their offsets
 * in key order (caller frees), *end_r the end of the last COMMIT.
 */
static int skiplist_replay(struct skiplist *sl, uint32_t **live_r, size_t *nlive_r,
                           uint32_t *end_r)
{
    struct skiplist_op *in = NULL, *log = NULL, *tmp = NULL, op;
    size_t nin = 0, ain = 0, nlog = 0, alog = 0, committed = 0, nlive = 0, i, j;
    uint32_t *adds = NULL, *live = NULL;
    size_t nadds = 0, aadds = 0;
    uint32_t off = skiplist_dummy_end(sl), commit_end, type, len;
    struct skiplist_node n;
    int sorted = 1, r = SKIPLIST_OK;

    *live_r = NULL;
    *nlive_r = 0;
    /* the checkpointed part */
    while ((uint64_t)off + 4 <= sl->size &&
           skiplist_get32(sl->map + off) == SKIPLIST_T_INORDER) {
        if (skiplist_parse_node(sl, off, &n) < 0) {
            r = skiplist_damaged(sl, off, "bad record in the checkpointed part");
            goto out;
        }
        op.key = n.key;
        op.keylen = n.keylen;
        op.off = off;
        op.del = 0;
        if (nin && skiplist_cmp(sl, in[nin - 1].key, in[nin - 1].keylen,
                                n.key, n.keylen) >= 0)
            sorted = 0;
        if (skiplist_push_op(&in, &nin, &ain, &op) < 0)
            goto nomem;
        off += n.size;
    }
    commit_end = off;

    /* the log */
    while (off < sl->size) {
        if (skiplist_parse_logrec(sl, off, &type, &len) < 0)
            break;
        if (type == SKIPLIST_T_ADD) {
            skiplist_parse_node(sl, off, &n);
            op.key = n.key;
            op.keylen = n.keylen;
            op.off = off;
            op.del = 0;
            if (skiplist_push_op(&log, &nlog, &alog, &op) < 0)
                goto nomem;
            if (nadds == aadds) {
                size_t na = aadds ? aadds * 2 : 256;
                uint32_t *p = realloc(adds, na * sizeof(*adds));
                if (!p)
                    goto nomem;
                adds = p;
                aadds = na;
            }
            adds[nadds++] = off;
        } else if (type == SKIPLIST_T_DELETE) {
            uint32_t target = skiplist_get32(sl->map + off + 4);
            size_t k, found = 0;

            /* the target must be the start of an earlier record */
            if (skiplist_offset_known(in, nin, target)) {
                found = 1;
            } else {
                size_t lo = 0, hi = nadds;
                while (lo < hi) {
                    k = lo + (hi - lo) / 2;
                    if (adds[k] == target) {
                        found = 1;
                        break;
                    }
                    if (adds[k] < target)
                        lo = k + 1;
                    else
                        hi = k;
                }
            }
            if (!found || skiplist_parse_node(sl, target, &n) < 0) {
                log_error("skiplist: DELETE of a non-record, log ends here file=<%s> offset=<%u> target=<%u>",
                          sl->fname, off, target);
                break;
            }
            op.key = n.key;
            op.keylen = n.keylen;
            op.off = target;
            op.del = 1;
            if (skiplist_push_op(&log, &nlog, &alog, &op) < 0)
                goto nomem;
        }
        off += len;
        if (type == SKIPLIST_T_COMMIT) {
            committed = nlog;
            commit_end = off;
        }
    }
    nlog = committed;
    if (commit_end < sl->size)
        log_debug("skiplist: replay ignores uncommitted bytes file=<%s> offset=<%u> bytes=<%zu>",
                    sl->fname, commit_end, sl->size - commit_end);

    if (!sorted) {
        /* not in our key order (damage or another comparator): sort all */
        log_warning("skiplist: checkpointed part not in key order, sorting file=<%s>",
                    sl->fname);
        for (i = 0; i < nlog; i++)
            if (skiplist_push_op(&in, &nin, &ain, &log[i]) < 0)
                goto nomem;
        free(log);
        log = in;
        nlog = nin;
        alog = ain;
        in = NULL;
        nin = ain = 0;
    }
    if (nlog) {
        tmp = malloc(nlog * sizeof(*tmp));
        if (!tmp)
            goto nomem;
        skiplist_sort_ops(sl, log, tmp, nlog);
        /* keep the last op of each key (the sort is stable) */
        for (i = 0, j = 0; i < nlog; i++) {
            if (i + 1 < nlog &&
                skiplist_cmp(sl, log[i].key, log[i].keylen,
                             log[i + 1].key, log[i + 1].keylen) == 0)
                continue;
            log[j++] = log[i];
        }
        nlog = j;
    }
    live = malloc((nin + nlog + 1) * sizeof(*live));
    if (!live)
        goto nomem;
    for (i = 0, j = 0; i < nin || j < nlog;) {
        int c;

        if (j == nlog)
            c = -1;
        else if (i == nin)
            c = 1;
        else
            c = skiplist_cmp(sl, in[i].key, in[i].keylen, log[j].key, log[j].keylen);
        if (c < 0) {
            live[nlive++] = in[i++].off;
        } else {
            if (!log[j].del)
                live[nlive++] = log[j].off;
            if (c == 0)
                i++;
            j++;
        }
    }
    *live_r = live;
    *nlive_r = nlive;
    *end_r = commit_end;
    live = NULL;
    goto out;

nomem:
    log_error("skiplist: out of memory in replay file=<%s>", sl->fname);
    r = SKIPLIST_IOERROR;
out:
    free(in);
    free(log);
    free(tmp);
    free(adds);
    free(live);
    return r;
}

/* Build (or keep) the replay view for reading a file awaiting recovery. */
static int skiplist_view_build(struct skiplist *sl)
{
    uint32_t end;
    int r;

    if (sl->view && sl->view_gen == sl->gen) {
        sl->use_view = 1;
        return SKIPLIST_OK;
    }
    skiplist_view_free(sl);
    r = skiplist_replay(sl, &sl->view, &sl->view_count, &end);
    if (r != SKIPLIST_OK)
        return r;
    sl->view_gen = sl->gen;
    sl->use_view = 1;
    return SKIPLIST_OK;
}

/* ---- rewrite: checkpoint and recovery --------------------------------- */

static int skiplist_write_chunk(struct skiplist *sl, int fd, struct buf *b, int force)
{
    if (!force && b->len < (1u << 20))
        return SKIPLIST_OK;
    if (b->len && fs_write_all(fd, b->s, b->len) < 0)
        return skiplist_syserr(sl, "write of the checkpoint file");
    buf_reset(b);
    return SKIPLIST_OK;
}

/*
 * Write the records `live` (offsets in key order) into "<fname>.NEW" as a
 * fresh checkpointed file and put it in place of the file.  Needs the
 * exclusive lock; on success the handle holds it on the new file.
 */
static int skiplist_rewrite(struct skiplist *sl, const uint32_t *live, size_t n)
{
    struct buf b = BUF_INITIALIZER;
    struct skiplist_node node;
    struct stat st;
    char *tmpname = NULL;
    uint32_t *newoff = NULL, *fwd = NULL, *fwdbase = NULL;
    unsigned char *lvl = NULL;
    uint32_t next[SKIPLIST_MAXLEVEL];
    uint32_t maxlevel = sl->maxlevel, curlevel = 1, i;
    uint64_t pos, nfwd = 0;
    size_t j;
    int fd = -1, r = SKIPLIST_OK;
    char hdr[SKIPLIST_HEADER_SIZE];

    if (asprintf(&tmpname, "%s.NEW", sl->fname) < 0) {
        tmpname = NULL;
        goto nomem;
    }
    newoff = malloc((n + 1) * sizeof(*newoff));
    fwdbase = malloc((n + 1) * sizeof(*fwdbase));
    lvl = malloc(n + 1);
    if (!newoff || !fwdbase || !lvl)
        goto nomem;
    pos = SKIPLIST_DUMMY_OFFSET + SKIPLIST_DUMMY_SIZE(maxlevel);
    for (j = 0; j < n; j++) {
        if (skiplist_parse_node(sl, live[j], &node) < 0) {
            r = skiplist_damaged(sl, live[j], "bad record while rewriting");
            goto out;
        }
        newoff[j] = (uint32_t)pos;
        lvl[j] = (unsigned char)node.level;
        fwdbase[j] = (uint32_t)nfwd;
        nfwd += node.level;
        if (node.level > curlevel)
            curlevel = node.level;
        pos += 12 + SKIPLIST_ROUNDUP(node.keylen) + SKIPLIST_ROUNDUP(node.datalen) +
               4 * (uint64_t)node.level + 4;
        if (pos > SKIPLIST_MAXFILE) {
            log_error("skiplist: rewrite would pass 4 GiB file=<%s>", sl->fname);
            r = SKIPLIST_FULL;
            goto out;
        }
    }
    fwd = malloc((size_t)(nfwd + 1) * sizeof(*fwd));
    if (!fwd)
        goto nomem;
    for (i = 0; i < maxlevel; i++)
        next[i] = 0;
    for (j = n; j-- > 0;) {
        for (i = 0; i < lvl[j]; i++) {
            fwd[fwdbase[j] + i] = next[i];
            next[i] = newoff[j];
        }
    }

    fd = open(tmpname, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        r = skiplist_syserr(sl, "create of the checkpoint file");
        goto out;
    }
    if (fs_fstat_id(sl->fd, &st) == 0) {
        if (fchmod(fd, st.st_mode & 07777) < 0)
            log_warning("skiplist: fchmod failed file=<%s> error=<%s>", tmpname, strerror(errno));
        if (geteuid() == 0 && fchown(fd, st.st_uid, st.st_gid) < 0)
            log_warning("skiplist: fchown failed file=<%s> error=<%s>", tmpname, strerror(errno));
    }

    memcpy(hdr, SKIPLIST_MAGIC, SKIPLIST_MAGIC_LEN);
    skiplist_put32(hdr + SKIPLIST_OFF_VERSION, SKIPLIST_VERSION);
    skiplist_put32(hdr + SKIPLIST_OFF_VERSION_MINOR, SKIPLIST_VERSION_MINOR);
    skiplist_put32(hdr + SKIPLIST_OFF_MAXLEVEL, maxlevel);
    skiplist_put32(hdr + SKIPLIST_OFF_CURLEVEL, curlevel);
    skiplist_put32(hdr + SKIPLIST_OFF_LISTSIZE, (uint32_t)n);
    skiplist_put32(hdr + SKIPLIST_OFF_LOGSTART, (uint32_t)pos);
    skiplist_put32(hdr + SKIPLIST_OFF_LASTRECOVERY, (uint32_t)time(NULL));
    if (buf_append(&b, hdr, sizeof(hdr)) < 0 ||
        skiplist_buf_put32(&b, SKIPLIST_T_DUMMY) < 0 ||
        skiplist_buf_put32(&b, 0) < 0 || skiplist_buf_put32(&b, 0) < 0)
        goto nomem;
    for (i = 0; i < maxlevel; i++)
        if (skiplist_buf_put32(&b, next[i]) < 0)
            goto nomem;
    if (skiplist_buf_put32(&b, SKIPLIST_PAD) < 0)
        goto nomem;
    for (j = 0; j < n; j++) {
        skiplist_parse_node(sl, live[j], &node);
        if (skiplist_buf_put32(&b, SKIPLIST_T_INORDER) < 0 ||
            skiplist_buf_put32(&b, node.keylen) < 0 ||
            skiplist_buf_padded(&b, node.key, node.keylen) < 0 ||
            skiplist_buf_put32(&b, node.datalen) < 0 ||
            skiplist_buf_padded(&b, node.data, node.datalen) < 0)
            goto nomem;
        for (i = 0; i < lvl[j]; i++)
            if (skiplist_buf_put32(&b, fwd[fwdbase[j] + i]) < 0)
                goto nomem;
        if (skiplist_buf_put32(&b, SKIPLIST_PAD) < 0)
            goto nomem;
        if ((r = skiplist_write_chunk(sl, fd, &b, 0)) != SKIPLIST_OK)
            goto out;
    }
    if ((r = skiplist_write_chunk(sl, fd, &b, 1)) != SKIPLIST_OK)
        goto out;
    if (fs_datasync(fd) < 0) {
        r = skiplist_syserr(sl, "fsync of the checkpoint file");
        goto out;
    }
    if (fs_lock(fd, F_WRLCK, 0) < 0) {
        r = skiplist_syserr(sl, "lock of the checkpoint file");
        goto out;
    }
    if (rename(tmpname, sl->fname) < 0) {
        r = skiplist_syserr(sl, "rename of the checkpoint file");
        goto out;
    }
    if (fs_fsync_parent(sl->fname) < 0)
        r = skiplist_syserr(sl, "fsync of the directory");
    /* the new file is in place: switch to it whatever happens next */
    close(sl->fd);
    sl->fd = fd;
    sl->fd_known = 0;
    sl->lock = F_WRLCK;
    fd = -1;
    {
        int r2 = skiplist_refresh(sl);
        if (r == SKIPLIST_OK)
            r = r2;
    }
    if (r == SKIPLIST_OK && sl->needs_recovery)
        r = skiplist_damaged(sl, 0, "rewritten file fails its own check");
    goto out;

nomem:
    log_error("skiplist: out of memory while rewriting file=<%s>", sl->fname);
    r = SKIPLIST_IOERROR;
out:
    if (fd >= 0) {
        close(fd);
        if (tmpname)
            unlink(tmpname);
    }
    buf_free(&b);
    free(tmpname);
    free(newoff);
    free(fwdbase);
    free(fwd);
    free(lvl);
    return r;
}

/* Replay and rewrite, under the exclusive lock. */
/*
 * The sort order is not recorded in the file.  Before a rebuild writes the
 * records in this handle's order, check that the checkpointed part (the
 * INORDER records, physically in the file's order) agrees with it: a file
 * opened with the other CYRUSDB_MBOXSORT setting must be refused, never
 * rewritten in an order its real users cannot search.
 */
static int skiplist_order_fits(struct skiplist *sl)
{
    struct skiplist_node prev, n;
    size_t steps = 0, limit = sl->size / 16 + 1;
    uint32_t off;
    int have_prev = 0;

    /* follow level 0 as the writers linked it; damage ends the look (the
     * replay and its checks then decide) */
    if (skiplist_parse_node(sl, SKIPLIST_DUMMY_OFFSET, &n) < 0)
        return 1;
    off = skiplist_fwd(sl, &n, 0);
    while (off && steps++ < limit) {
        if (skiplist_parse_node(sl, off, &n) < 0 ||
            (n.type != SKIPLIST_T_INORDER && n.type != SKIPLIST_T_ADD))
            return 1;
        if (have_prev && skiplist_cmp(sl, prev.key, prev.keylen,
                                      n.key, n.keylen) >= 0)
            return 0;
        prev = n;
        have_prev = 1;
        off = skiplist_fwd(sl, &n, 0);
    }
    return 1;
}

static int skiplist_check_order(struct skiplist *sl)
{
    if (skiplist_order_fits(sl))
        return SKIPLIST_OK;
    log_error("skiplist: refusing to rewrite file=<%s> error=<keys out of "
              "this handle's order: the file was written with the other "
              "CYRUSDB_MBOXSORT setting>", sl->fname);
    return SKIPLIST_IOERROR;
}

static int skiplist_rebuild(struct skiplist *sl, const char *why)
{
    uint32_t *live = NULL, end = 0;
    size_t n = 0, before = sl->size;
    int r;

    r = skiplist_check_order(sl);
    if (r != SKIPLIST_OK)
        return r;
    r = skiplist_replay(sl, &live, &n, &end);
    if (r == SKIPLIST_OK)
        r = skiplist_rewrite(sl, live, n);
    free(live);
    if (r == SKIPLIST_OK) {
        skiplist_view_free(sl);
        log_info("skiplist: %s file=<%s> records=<%zu> before=<%zu> after=<%zu>",
                 why, sl->fname, n, before, sl->size);
    } else {
        log_error("skiplist: %s failed file=<%s> error=<%d>", why, sl->fname, r);
    }
    return r;
}

/* Write the header and dummy of a new database into a 0-byte file. */
static int skiplist_init_file(struct skiplist *sl)
{
    struct buf b = BUF_INITIALIZER;
    char hdr[SKIPLIST_HEADER_SIZE];
    uint32_t i;
    int r = SKIPLIST_OK;

    memcpy(hdr, SKIPLIST_MAGIC, SKIPLIST_MAGIC_LEN);
    skiplist_put32(hdr + SKIPLIST_OFF_VERSION, SKIPLIST_VERSION);
    skiplist_put32(hdr + SKIPLIST_OFF_VERSION_MINOR, SKIPLIST_VERSION_MINOR);
    skiplist_put32(hdr + SKIPLIST_OFF_MAXLEVEL, SKIPLIST_MAXLEVEL);
    skiplist_put32(hdr + SKIPLIST_OFF_CURLEVEL, 1);
    skiplist_put32(hdr + SKIPLIST_OFF_LISTSIZE, 0);
    skiplist_put32(hdr + SKIPLIST_OFF_LOGSTART,
                   SKIPLIST_DUMMY_OFFSET + SKIPLIST_DUMMY_SIZE(SKIPLIST_MAXLEVEL));
    skiplist_put32(hdr + SKIPLIST_OFF_LASTRECOVERY, (uint32_t)time(NULL));
    if (buf_append(&b, hdr, sizeof(hdr)) < 0 ||
        skiplist_buf_put32(&b, SKIPLIST_T_DUMMY) < 0 ||
        skiplist_buf_put32(&b, 0) < 0 || skiplist_buf_put32(&b, 0) < 0) {
        r = SKIPLIST_IOERROR;
        goto out;
    }
    for (i = 0; i < SKIPLIST_MAXLEVEL; i++)
        if (skiplist_buf_put32(&b, 0) < 0)
            r = SKIPLIST_IOERROR;
    if (r || skiplist_buf_put32(&b, SKIPLIST_PAD) < 0) {
        r = SKIPLIST_IOERROR;
        goto out;
    }
    if (fs_pwrite_all(sl->fd, b.s, b.len, 0) < 0 || fs_datasync(sl->fd) < 0) {
        r = skiplist_syserr(sl, "write of the header");
        if (ftruncate(sl->fd, 0) < 0)
            log_error("skiplist: ftruncate failed file=<%s> error=<%s>", sl->fname, strerror(errno));
        goto out;
    }
    r = skiplist_refresh(sl);
out:
    buf_free(&b);
    return r;
}

/* ---- locks --------------------------------------------------------- */

static int skiplist_setlock(struct skiplist *sl, int type)
{
    if (fs_lock(sl->fd, type, 1) < 0) {
        if (errno == EDEADLK) {
            log_warning("skiplist: lock deadlock file=<%s>", sl->fname);
            return SKIPLIST_AGAIN;
        }
        return skiplist_syserr(sl, "fcntl lock");
    }
    sl->lock = type;
    return SKIPLIST_OK;
}

static void skiplist_release(struct skiplist *sl)
{
    int type = sl->depth > 0 ? F_RDLCK : F_UNLCK;

    if (fs_lock(sl->fd, type, 1) < 0)
        log_error("skiplist: unlock failed file=<%s> error=<%s>", sl->fname, strerror(errno));
    sl->lock = type;
}

int skiplist_read_lock(struct skiplist *sl)
{
    int r;

    if (sl->lock != F_UNLCK) {
        sl->depth++;
        return SKIPLIST_OK;
    }
    if ((r = skiplist_setlock(sl, F_RDLCK)) != SKIPLIST_OK)
        return r;
    r = skiplist_refresh(sl);
    if (r == SKIPLIST_OK) {
        if (sl->needs_recovery && sl->size)
            r = skiplist_view_build(sl);
        else
            sl->use_view = 0;
    }
    if (r != SKIPLIST_OK) {
        skiplist_release(sl);
        return r;
    }
    sl->depth = 1;
    return SKIPLIST_OK;
}

void skiplist_read_unlock(struct skiplist *sl)
{
    if (sl->depth == 0) {
        log_error("skiplist: unlock without lock file=<%s>", sl->fname);
        return;
    }
    if (--sl->depth == 0 && !sl->in_txn)
        skiplist_release(sl);
}

/* Take the exclusive lock and make the file fit for writing: initialise a
 * 0-byte file, recover a crashed writer's tail. */
static int skiplist_lock_write(struct skiplist *sl)
{
    int r;

    if ((r = skiplist_setlock(sl, F_WRLCK)) != SKIPLIST_OK)
        return r;
    r = skiplist_refresh(sl);
    if (r == SKIPLIST_OK && sl->size == 0)
        r = skiplist_init_file(sl);
    if (r == SKIPLIST_OK && sl->needs_recovery)
        r = skiplist_rebuild(sl, "recovered");
    if (r == SKIPLIST_OK)
        sl->use_view = 0;
    else
        skiplist_release(sl);
    return r;
}

/* ---- open / close ------------------------------------------------------ */

int skiplist_detect(const char *head, size_t len)
{
    return len >= SKIPLIST_MAGIC_LEN && memcmp(head, SKIPLIST_MAGIC, SKIPLIST_MAGIC_LEN) == 0;
}

int skiplist_open(const char *fname, int flags, struct skiplist **sl_r,
                  const char **error_r)
{
    struct skiplist *sl;
    int created = 0, fd, r;

    *sl_r = NULL;
    *error_r = NULL;
    fd = open(fname, ((flags & SKIPLIST_RDONLY) ? O_RDONLY : O_RDWR) | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && (flags & SKIPLIST_CREATE) &&
        !(flags & SKIPLIST_RDONLY)) {
        if (fs_mkdir_parent(fname, 0755) < 0) {
            log_error("skiplist: mkdir failed file=<%s> error=<%s>", fname, strerror(errno));
            *error_r = "cannot create the directory";
            return SKIPLIST_IOERROR;
        }
        fd = open(fname, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
        created = 1;
    }
    if (fd < 0) {
        if (errno == ENOENT) {
            *error_r = "no such database file";
            return SKIPLIST_NOTFILE;
        }
        log_error("skiplist: open failed file=<%s> error=<%s>", fname, strerror(errno));
        *error_r = "cannot open the file";
        return SKIPLIST_IOERROR;
    }
    sl = calloc(1, sizeof(*sl));
    if (!sl || !(sl->fname = strdup(fname))) {
        free(sl);
        close(fd);
        *error_r = "out of memory";
        return SKIPLIST_IOERROR;
    }
    sl->fd = fd;
    sl->flags = flags;
    sl->lock = F_UNLCK;
    sl->maxlevel = SKIPLIST_MAXLEVEL;
    sl->rng = ((uint64_t)time(NULL) << 20) ^ (uint64_t)getpid() ^
              ((uint64_t)(uintptr_t)sl << 7) ^ 0x9E3779B97F4A7C15ULL;
    if (!sl->rng)
        sl->rng = 1;

    /* look at the file; a writer repairs what needs it now */
    r = skiplist_setlock(sl, F_RDLCK);
    if (r == SKIPLIST_OK) {
        r = skiplist_refresh(sl);
        skiplist_release(sl);
    }
    if (r == SKIPLIST_OK && !(flags & SKIPLIST_RDONLY) &&
        (sl->size == 0 || sl->needs_recovery)) {
        r = skiplist_lock_write(sl);
        if (r == SKIPLIST_OK)
            skiplist_release(sl);
    }
    if (r == SKIPLIST_OK && created && fs_fsync_parent(fname) < 0)
        r = skiplist_syserr(sl, "fsync of the directory");
    if (r != SKIPLIST_OK) {
        switch (r) {
        case SKIPLIST_BADFORMAT: *error_r = "not a skiplist file"; break;
        case SKIPLIST_FULL:      *error_r = "no space left"; break;
        case SKIPLIST_AGAIN:     *error_r = "lock deadlock"; break;
        default:                 *error_r = "damaged or unreadable skiplist file"; break;
        }
        skiplist_close(&sl);
        return r;
    }
    *sl_r = sl;
    return SKIPLIST_OK;
}

void skiplist_close(struct skiplist **slp)
{
    struct skiplist *sl = *slp;

    if (!sl)
        return;
    *slp = NULL;
    if (sl->in_txn)
        skiplist_txn_abort(sl);
    if (sl->lock != F_UNLCK)
        fs_lock(sl->fd, F_UNLCK, 1);
    skiplist_unmap(sl);
    skiplist_view_free(sl);
    if (sl->fd >= 0)
        close(sl->fd);
    buf_free(&sl->wbuf);
    free(sl->txn_recs);
    free(sl->fname);
    free(sl);
}

/* ---- search ---------------------------------------------------------- */

/* Index of the first view entry with key >= key (after: > key). */
static int skiplist_view_bound(struct skiplist *sl, const char *key, size_t keylen,
                               int after, size_t *idx_r)
{
    size_t lo = 0, hi = sl->view_count;
    struct skiplist_node n;

    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c;

        if (skiplist_parse_node(sl, sl->view[mid], &n) < 0)
            return skiplist_damaged(sl, sl->view[mid], "replayed record vanished");
        c = skiplist_cmp(sl, n.key, n.keylen, key, keylen);
        if (c < 0 || (after && c == 0))
            lo = mid + 1;
        else
            hi = mid;
    }
    *idx_r = lo;
    return SKIPLIST_OK;
}

/*
 * Follow the pointers to the first node with key >= key: its offset in
 * *found_r (0: none).  update[i] gets the last node before it at level i.
 * Every step must reach a strictly greater key at a node of sufficient
 * level, so loops and misordered pointers are reported, not followed.
 */
static int skiplist_search(struct skiplist *sl, const char *key, size_t keylen,
                           uint32_t *update, uint32_t *found_r)
{
    struct skiplist_node cur, nxt;
    uint32_t off = 0;
    int i;

    *found_r = 0;
    if (skiplist_parse_node(sl, SKIPLIST_DUMMY_OFFSET, &cur) < 0)
        return skiplist_damaged(sl, SKIPLIST_DUMMY_OFFSET, "bad dummy node");
    for (i = (int)sl->curlevel - 1; i >= 0; i--) {
        for (;;) {
            off = skiplist_fwd(sl, &cur, (uint32_t)i);
            if (!off)
                break;
            if (skiplist_parse_node(sl, off, &nxt) < 0 || nxt.type == SKIPLIST_T_DUMMY)
                return skiplist_damaged(sl, cur.fwdpos + 4 * (uint32_t)i,
                                        "forward pointer to no record");
            if ((uint32_t)i >= nxt.level)
                return skiplist_damaged(sl, cur.fwdpos + 4 * (uint32_t)i,
                                        "forward pointer to a lower node");
            if (cur.type != SKIPLIST_T_DUMMY &&
                skiplist_cmp(sl, cur.key, cur.keylen, nxt.key, nxt.keylen) >= 0)
                return skiplist_damaged(sl, cur.fwdpos + 4 * (uint32_t)i,
                                        "forward pointer out of key order");
            if (skiplist_cmp(sl, nxt.key, nxt.keylen, key, keylen) >= 0)
                break;
            cur = nxt;
        }
        if (update)
            update[i] = cur.off;
        if (i == 0)
            *found_r = off;
    }
    if (update)
        for (i = (int)sl->curlevel; i < (int)sl->maxlevel; i++)
            update[i] = SKIPLIST_DUMMY_OFFSET;
    return SKIPLIST_OK;
}

static void skiplist_fill(const struct skiplist_node *n, struct skiplist_record *rec)
{
    rec->key = n->key;
    rec->keylen = n->keylen;
    rec->data = n->data;
    rec->datalen = n->datalen;
}

int skiplist_seek(struct skiplist *sl, const char *key, size_t keylen,
                  int after, struct skiplist_record *rec_r)
{
    struct skiplist_node n;
    uint32_t off = 0;
    int r, c;

    if (sl->lock == F_UNLCK)
        return SKIPLIST_MISUSE;
    if (!key)
        keylen = 0;
    if (sl->size == 0)
        return SKIPLIST_NOTFOUND;
    if (sl->use_view) {
        size_t idx = 0;

        if ((r = skiplist_view_bound(sl, key, keylen, after, &idx)) != SKIPLIST_OK)
            return r;
        if (idx >= sl->view_count)
            return SKIPLIST_NOTFOUND;
        if (skiplist_parse_node(sl, sl->view[idx], &n) < 0)
            return skiplist_damaged(sl, sl->view[idx], "replayed record vanished");
        skiplist_fill(&n, rec_r);
        return SKIPLIST_OK;
    }
    if (after && sl->cursor_off && sl->cursor_gen == sl->gen &&
        skiplist_parse_node(sl, sl->cursor_off, &n) == 0 &&
        skiplist_cmp(sl, n.key, n.keylen, key, keylen) == 0) {
        off = skiplist_fwd(sl, &n, 0);
    } else {
        if ((r = skiplist_search(sl, key, keylen, NULL, &off)) != SKIPLIST_OK)
            return r;
        if (after && off) {
            if (skiplist_parse_node(sl, off, &n) < 0)
                return skiplist_damaged(sl, off, "bad record");
            if (skiplist_cmp(sl, n.key, n.keylen, key, keylen) == 0)
                off = skiplist_fwd(sl, &n, 0);
        }
    }
    sl->cursor_off = 0;
    if (!off)
        return SKIPLIST_NOTFOUND;
    if (skiplist_parse_node(sl, off, &n) < 0 || n.type == SKIPLIST_T_DUMMY)
        return skiplist_damaged(sl, off, "forward pointer to no record");
    c = skiplist_cmp(sl, n.key, n.keylen, key, keylen);
    if (c < 0 || (after && c == 0))
        return skiplist_damaged(sl, off, "forward pointer out of key order");
    sl->cursor_off = off;
    sl->cursor_gen = sl->gen;
    skiplist_fill(&n, rec_r);
    return SKIPLIST_OK;
}

int skiplist_fetch(struct skiplist *sl, const char *key, size_t keylen,
                   struct skiplist_record *rec_r)
{
    struct skiplist_record rec;
    int r = skiplist_seek(sl, key, keylen, 0, &rec);

    if (r != SKIPLIST_OK)
        return r;
    if (skiplist_cmp(sl, rec.key, rec.keylen, key, keylen) != 0)
        return SKIPLIST_NOTFOUND;
    *rec_r = rec;
    return SKIPLIST_OK;
}

/* ---- writes -------------------------------------------------------- */

static int skiplist_append(struct skiplist *sl, const char *p, size_t len)
{
    int r;

    if ((uint64_t)sl->txn_end + len > SKIPLIST_MAXFILE) {
        log_error("skiplist: file would pass 4 GiB file=<%s>", sl->fname);
        sl->txn_failed = 1;
        return SKIPLIST_FULL;
    }
    if (fs_pwrite_all(sl->fd, p, len, (off_t)sl->txn_end) < 0) {
        sl->txn_failed = 1;
        return skiplist_syserr(sl, "append");
    }
    sl->txn_end += (uint32_t)len;
    sl->size = sl->txn_end;
    sl->gen++;
    if ((r = skiplist_map_file(sl)) != SKIPLIST_OK)
        sl->txn_failed = 1;
    return r;
}

static int skiplist_note_rec(struct skiplist *sl, uint32_t off)
{
    if (sl->txn_nrecs == sl->txn_alloc) {
        size_t na = sl->txn_alloc ? sl->txn_alloc * 2 : 64;
        uint32_t *p = realloc(sl->txn_recs, na * sizeof(*p));
        if (!p) {
            sl->txn_failed = 1;
            log_error("skiplist: out of memory file=<%s>", sl->fname);
            return SKIPLIST_IOERROR;
        }
        sl->txn_recs = p;
        sl->txn_alloc = na;
    }
    sl->txn_recs[sl->txn_nrecs++] = off;
    return SKIPLIST_OK;
}

/* Set forward pointer i of the node at nodeoff to val, in place. */
static int skiplist_set_fwd(struct skiplist *sl, uint32_t nodeoff, uint32_t i, uint32_t val)
{
    struct skiplist_node n;
    char w[4];

    if (skiplist_parse_node(sl, nodeoff, &n) < 0 || i >= n.level)
        return skiplist_damaged(sl, nodeoff, "pointer update on a bad node");
    skiplist_put32(w, val);
    if (fs_pwrite_all(sl->fd, w, 4, (off_t)n.fwdpos + 4 * (off_t)i) < 0)
        return skiplist_syserr(sl, "pointer write");
    sl->gen++;
    return SKIPLIST_OK;
}

static int skiplist_get_fwd(struct skiplist *sl, uint32_t nodeoff, uint32_t i, uint32_t *val_r)
{
    struct skiplist_node n;

    if (skiplist_parse_node(sl, nodeoff, &n) < 0 || i >= n.level)
        return skiplist_damaged(sl, nodeoff, "pointer read on a bad node");
    *val_r = skiplist_fwd(sl, &n, i);
    return SKIPLIST_OK;
}

static int skiplist_write_curlevel(struct skiplist *sl, uint32_t level)
{
    char w[4];

    skiplist_put32(w, level);
    if (fs_pwrite_all(sl->fd, w, 4, SKIPLIST_OFF_CURLEVEL) < 0)
        return skiplist_syserr(sl, "header write");
    sl->curlevel = level;
    sl->gen++;
    return SKIPLIST_OK;
}

static int skiplist_check_txn(struct skiplist *sl)
{
    if (!sl->in_txn)
        return SKIPLIST_MISUSE;
    if (sl->txn_failed) {
        log_error("skiplist: write in a failed transaction file=<%s>", sl->fname);
        return SKIPLIST_IOERROR;
    }
    return SKIPLIST_OK;
}

int skiplist_store(struct skiplist *sl, const char *key, size_t keylen,
                   const char *data, size_t datalen, int overwrite)
{
    uint32_t update[SKIPLIST_MAXLEVEL], fwd[SKIPLIST_MAXLEVEL];
    uint32_t found, lvl, i, newoff, oldoff = 0;
    struct skiplist_node n;
    struct buf *b = &sl->wbuf;
    int r, exact = 0;

    if ((r = skiplist_check_txn(sl)) != SKIPLIST_OK)
        return r;
    if (keylen == 0 || keylen > SKIPLIST_MAX_KEYLEN || datalen > SKIPLIST_MAX_DATALEN)
        return SKIPLIST_MISUSE;
    if (!data)
        datalen = 0;
    if ((r = skiplist_search(sl, key, keylen, update, &found)) != SKIPLIST_OK)
        return r;
    if (found) {
        if (skiplist_parse_node(sl, found, &n) < 0)
            return skiplist_damaged(sl, found, "bad record");
        exact = skiplist_cmp(sl, n.key, n.keylen, key, keylen) == 0;
    }
    buf_reset(b);
    if (exact) {
        if (!overwrite)
            return SKIPLIST_EXISTS;
        /* replace with a node of the same height and the same successors */
        oldoff = found;
        lvl = n.level;
        for (i = 0; i < lvl; i++)
            fwd[i] = skiplist_fwd(sl, &n, i);
        if (skiplist_buf_put32(b, SKIPLIST_T_DELETE) < 0 ||
            skiplist_buf_put32(b, oldoff) < 0)
            goto nomem;
        newoff = sl->txn_end + 8;
    } else {
        lvl = skiplist_random_level(sl);
        if (lvl > sl->curlevel) {
            for (i = sl->curlevel; i < lvl; i++)
                update[i] = SKIPLIST_DUMMY_OFFSET;
            if ((r = skiplist_write_curlevel(sl, lvl)) != SKIPLIST_OK) {
                sl->txn_failed = 1;
                return r;
            }
        }
        for (i = 0; i < lvl; i++)
            if ((r = skiplist_get_fwd(sl, update[i], i, &fwd[i])) != SKIPLIST_OK)
                return r;
        newoff = sl->txn_end;
    }
    if (skiplist_buf_put32(b, SKIPLIST_T_ADD) < 0 ||
        skiplist_buf_put32(b, (uint32_t)keylen) < 0 ||
        skiplist_buf_padded(b, key, keylen) < 0 ||
        skiplist_buf_put32(b, (uint32_t)datalen) < 0 ||
        skiplist_buf_padded(b, data, datalen) < 0)
        goto nomem;
    for (i = 0; i < lvl; i++)
        if (skiplist_buf_put32(b, fwd[i]) < 0)
            goto nomem;
    if (skiplist_buf_put32(b, SKIPLIST_PAD) < 0)
        goto nomem;

    /* the records first, then the pointers that lead to them */
    if ((r = skiplist_append(sl, b->s, b->len)) != SKIPLIST_OK)
        return r;
    if (exact && (r = skiplist_note_rec(sl, newoff - 8)) != SKIPLIST_OK)
        return r;
    if ((r = skiplist_note_rec(sl, newoff)) != SKIPLIST_OK)
        return r;
    for (i = 0; i < lvl; i++) {
        if (exact) {
            uint32_t cur;
            if ((r = skiplist_get_fwd(sl, update[i], i, &cur)) != SKIPLIST_OK)
                goto fail;
            if (cur != oldoff) {
                r = skiplist_damaged(sl, update[i], "predecessor does not lead to the record");
                goto fail;
            }
        }
        if ((r = skiplist_set_fwd(sl, update[i], i, newoff)) != SKIPLIST_OK)
            goto fail;
    }
    return SKIPLIST_OK;

fail:
    sl->txn_failed = 1;
    return r;
nomem:
    log_error("skiplist: out of memory file=<%s>", sl->fname);
    return SKIPLIST_IOERROR;
}

int skiplist_delete(struct skiplist *sl, const char *key, size_t keylen)
{
    uint32_t update[SKIPLIST_MAXLEVEL], fwd[SKIPLIST_MAXLEVEL];
    uint32_t found, i, cur;
    struct skiplist_node n;
    char rec[8];
    int r;

    if ((r = skiplist_check_txn(sl)) != SKIPLIST_OK)
        return r;
    if ((r = skiplist_search(sl, key, keylen, update, &found)) != SKIPLIST_OK)
        return r;
    if (!found)
        return SKIPLIST_NOTFOUND;
    if (skiplist_parse_node(sl, found, &n) < 0)
        return skiplist_damaged(sl, found, "bad record");
    if (skiplist_cmp(sl, n.key, n.keylen, key, keylen) != 0)
        return SKIPLIST_NOTFOUND;
    for (i = 0; i < n.level; i++)
        fwd[i] = skiplist_fwd(sl, &n, i);
    skiplist_put32(rec, SKIPLIST_T_DELETE);
    skiplist_put32(rec + 4, found);
    if ((r = skiplist_append(sl, rec, 8)) != SKIPLIST_OK)
        return r;
    if ((r = skiplist_note_rec(sl, sl->txn_end - 8)) != SKIPLIST_OK)
        return r;
    for (i = 0; i < sl->curlevel && i < n.level; i++) {
        if ((r = skiplist_get_fwd(sl, update[i], i, &cur)) != SKIPLIST_OK)
            goto fail;
        if (cur != found)
            break;
        if ((r = skiplist_set_fwd(sl, update[i], i, fwd[i])) != SKIPLIST_OK)
            goto fail;
    }
    return SKIPLIST_OK;
fail:
    sl->txn_failed = 1;
    return r;
}

/* ---- transactions -------------------------------------------------- */

int skiplist_stamp(struct skiplist *sl, int now, uint64_t stamp[3])
{
    struct stat st;

    if (sl->in_txn || sl->ino == 0)
        return SKIPLIST_MISUSE;
    if (!now) {
        stamp[0] = (uint64_t)sl->dev;
        stamp[1] = (uint64_t)sl->ino;
        stamp[2] = (uint64_t)sl->size;
        return SKIPLIST_OK;
    }
    if (fs_stat_id(sl->fname, &st) < 0)
        return skiplist_syserr(sl, "stat");
    stamp[0] = (uint64_t)st.st_dev;
    stamp[1] = (uint64_t)st.st_ino;
    stamp[2] = (uint64_t)st.st_size;
    return SKIPLIST_OK;
}

int skiplist_in_txn(const struct skiplist *sl)
{
    return sl->in_txn;
}

int skiplist_txn_begin(struct skiplist *sl)
{
    int r;

    if (sl->flags & SKIPLIST_RDONLY)
        return SKIPLIST_READONLY;
    if (sl->in_txn)
        return SKIPLIST_MISUSE;
    if ((r = skiplist_lock_write(sl)) != SKIPLIST_OK)
        return r;
    sl->in_txn = 1;
    sl->txn_failed = 0;
    sl->txn_start = sl->txn_end = (uint32_t)sl->size;
    sl->txn_curlevel = sl->curlevel;
    sl->txn_nrecs = 0;
    return SKIPLIST_OK;
}

/* Undo the transaction's pointer changes, newest first. */
static int skiplist_undo(struct skiplist *sl)
{
    uint32_t update[SKIPLIST_MAXLEVEL], found, i, cur;
    struct skiplist_node n, t;
    size_t k;
    int r;

    for (k = sl->txn_nrecs; k-- > 0;) {
        uint32_t off = sl->txn_recs[k];

        if ((uint64_t)off + 8 > sl->size)
            return skiplist_damaged(sl, off, "transaction record vanished");
        if (skiplist_get32(sl->map + off) == SKIPLIST_T_ADD) {
            if (skiplist_parse_node(sl, off, &n) < 0)
                return skiplist_damaged(sl, off, "transaction record vanished");
            if ((r = skiplist_search(sl, n.key, n.keylen, update, &found)) != SKIPLIST_OK)
                return r;
            for (i = 0; i < n.level && i < sl->curlevel; i++) {
                if ((r = skiplist_get_fwd(sl, update[i], i, &cur)) != SKIPLIST_OK)
                    return r;
                if (cur != off)
                    break;
                if ((r = skiplist_set_fwd(sl, update[i], i, skiplist_fwd(sl, &n, i))) != SKIPLIST_OK)
                    return r;
            }
        } else {
            uint32_t target = skiplist_get32(sl->map + off + 4);

            if (skiplist_parse_node(sl, target, &t) < 0)
                return skiplist_damaged(sl, target, "deleted record vanished");
            if ((r = skiplist_search(sl, t.key, t.keylen, update, &found)) != SKIPLIST_OK)
                return r;
            for (i = 0; i < t.level; i++)
                if ((r = skiplist_set_fwd(sl, update[i], i, target)) != SKIPLIST_OK)
                    return r;
        }
    }
    return SKIPLIST_OK;
}

/* End the transaction: undo it and cut the file back to where it began. */
static int skiplist_rollback(struct skiplist *sl)
{
    int r = SKIPLIST_OK;

    if (sl->txn_end != sl->txn_start || sl->txn_nrecs || sl->txn_failed) {
        r = sl->txn_failed ? SKIPLIST_IOERROR : skiplist_undo(sl);
        if (r == SKIPLIST_OK && sl->curlevel != sl->txn_curlevel)
            r = skiplist_write_curlevel(sl, sl->txn_curlevel);
        if (ftruncate(sl->fd, (off_t)sl->txn_start) < 0) {
            int r2 = skiplist_syserr(sl, "ftruncate");
            if (r == SKIPLIST_OK)
                r = r2;
        }
        sl->size = sl->txn_start;
        sl->valid_end = sl->txn_start;
        sl->gen++;
        if (r != SKIPLIST_OK) {
            /* the pointers are unknown: rebuild them from the records */
            log_warning("skiplist: abort rebuilds the file file=<%s>", sl->fname);
            r = skiplist_refresh(sl);
            if (r == SKIPLIST_OK)
                r = skiplist_rebuild(sl, "recovered after a failed transaction");
        }
    } else if (sl->curlevel != sl->txn_curlevel) {
        r = skiplist_write_curlevel(sl, sl->txn_curlevel);
    }
    sl->in_txn = 0;
    sl->txn_failed = 0;
    sl->txn_nrecs = 0;
    skiplist_release(sl);
    return r;
}

int skiplist_txn_abort(struct skiplist *sl)
{
    if (!sl->in_txn)
        return SKIPLIST_MISUSE;
    return skiplist_rollback(sl);
}

int skiplist_txn_commit(struct skiplist *sl)
{
    char w[4];
    int r;

    if (!sl->in_txn)
        return SKIPLIST_MISUSE;
    if (sl->txn_failed) {
        skiplist_rollback(sl);
        return SKIPLIST_IOERROR;
    }
    if (sl->txn_end == sl->txn_start) {
        sl->in_txn = 0;
        skiplist_release(sl);
        return SKIPLIST_OK;
    }
    if (!(sl->flags & SKIPLIST_NOSYNC) && fs_datasync(sl->fd) < 0) {
        r = skiplist_syserr(sl, "fsync before commit");
        sl->txn_failed = 0;
        skiplist_rollback(sl);
        return r;
    }
    skiplist_put32(w, SKIPLIST_T_COMMIT);
    if ((r = skiplist_append(sl, w, 4)) != SKIPLIST_OK) {
        sl->txn_failed = 0;
        skiplist_rollback(sl);
        return r;
    }
    if (!(sl->flags & (SKIPLIST_NOSYNC | SKIPLIST_ORDERED)) &&
        fs_datasync(sl->fd) < 0) {
        r = skiplist_syserr(sl, "fsync of the commit");
        sl->txn_failed = 0;
        skiplist_rollback(sl);
        return r;
    }
    sl->valid_end = sl->size;
    sl->in_txn = 0;
    sl->txn_nrecs = 0;
    if (!(sl->flags & SKIPLIST_NOCOMPACT) &&
        (uint64_t)sl->size > 2 * (uint64_t)sl->logstart + SKIPLIST_MINREWRITE) {
        /* the commit is durable already; a failed checkpoint only logs */
        (void)skiplist_rebuild(sl, "checkpointed");
    }
    skiplist_release(sl);
    return SKIPLIST_OK;
}

/* ---- whole-file operations ----------------------------------------- */

int skiplist_checkpoint(struct skiplist *sl)
{
    int r;

    if (sl->flags & SKIPLIST_RDONLY)
        return SKIPLIST_READONLY;
    if (sl->in_txn)
        return SKIPLIST_MISUSE;
    if ((r = skiplist_lock_write(sl)) != SKIPLIST_OK)
        return r;
    r = skiplist_rebuild(sl, "checkpointed");
    skiplist_release(sl);
    return r;
}

/*
 * Recover one file now (rewrite it from its committed records), whatever
 * its state, for the directory-wide recovery run while no process uses it.
 * The file's sort order is not recorded: the rebuild is tried in plain
 * order and, if the checkpointed records are not in that order, in mailbox
 * order (skiplist_check_order refuses a rebuild in the wrong one).
 */
static int skiplist_recover_in_order(const char *fname, int flags,
                                     int *wrong_order_r)
{
    struct skiplist *sl;
    const char *err;
    int r;

    *wrong_order_r = 0;
    r = skiplist_open(fname, flags, &sl, &err);
    if (r != SKIPLIST_OK)
        return r;
    r = skiplist_setlock(sl, F_WRLCK);
    if (r == SKIPLIST_OK) {
        r = skiplist_refresh(sl);
        if (r == SKIPLIST_OK && sl->size && !skiplist_order_fits(sl))
            *wrong_order_r = 1;
        else if (r == SKIPLIST_OK && sl->size)
            r = skiplist_rebuild(sl, "recovered");
        skiplist_release(sl);
    }
    skiplist_close(&sl);
    return r;
}

int skiplist_recover_file(const char *fname)
{
    int wrong, r;

    r = skiplist_recover_in_order(fname, 0, &wrong);
    if (r == SKIPLIST_OK && wrong)
        r = skiplist_recover_in_order(fname, SKIPLIST_MBOXSORT, &wrong);
    if (r == SKIPLIST_OK && wrong) {
        log_error("skiplist: recovery failed file=<%s> error=<keys in "
                  "neither plain nor mailbox order>", fname);
        r = SKIPLIST_IOERROR;
    }
    return r;
}

/* The structural check of consistent(): walk level 0 and verify every
 * pointer of every level; *list_r gets the offsets walked. */
static int skiplist_check_links(struct skiplist *sl, uint32_t **list_r, size_t *n_r)
{
    uint32_t last[SKIPLIST_MAXLEVEL], i, off, val;
    struct skiplist_node d, n, prev;
    uint32_t *list = NULL;
    size_t count = 0, alloc = 0, limit = sl->size / 16 + 1;
    int r, have_prev = 0;

    *list_r = NULL;
    *n_r = 0;
    if (skiplist_parse_node(sl, SKIPLIST_DUMMY_OFFSET, &d) < 0)
        return skiplist_damaged(sl, SKIPLIST_DUMMY_OFFSET, "bad dummy node");
    for (i = sl->curlevel; i < sl->maxlevel; i++)
        if (skiplist_fwd(sl, &d, i) != 0)
            return skiplist_damaged(sl, d.fwdpos + 4 * i, "pointer above curlevel");
    for (i = 0; i < sl->maxlevel; i++)
        last[i] = SKIPLIST_DUMMY_OFFSET;
    off = skiplist_fwd(sl, &d, 0);
    while (off) {
        if (count >= limit) {
            r = skiplist_damaged(sl, off, "pointer loop");
            goto fail;
        }
        if (skiplist_parse_node(sl, off, &n) < 0 || n.type == SKIPLIST_T_DUMMY) {
            r = skiplist_damaged(sl, off, "level 0 pointer to no record");
            goto fail;
        }
        if ((n.type == SKIPLIST_T_INORDER) != (off < sl->logstart)) {
            r = skiplist_damaged(sl, off, "record type does not fit its place");
            goto fail;
        }
        if (n.level > sl->curlevel) {
            r = skiplist_damaged(sl, off, "record level above curlevel");
            goto fail;
        }
        if (have_prev && skiplist_cmp(sl, prev.key, prev.keylen, n.key, n.keylen) >= 0) {
            r = skiplist_damaged(sl, off, "keys out of order");
            goto fail;
        }
        for (i = 0; i < n.level; i++) {
            if ((r = skiplist_get_fwd(sl, last[i], i, &val)) != SKIPLIST_OK)
                goto fail;
            if (val != off) {
                r = skiplist_damaged(sl, last[i], "forward pointer skips or misses a record");
                goto fail;
            }
            last[i] = off;
        }
        if (count == alloc) {
            size_t na = alloc ? alloc * 2 : 256;
            uint32_t *p = realloc(list, na * sizeof(*p));
            if (!p) {
                r = SKIPLIST_IOERROR;
                goto fail;
            }
            list = p;
            alloc = na;
        }
        list[count++] = off;
        prev = n;
        have_prev = 1;
        off = skiplist_fwd(sl, &n, 0);
    }
    for (i = 0; i < sl->maxlevel; i++) {
        if ((r = skiplist_get_fwd(sl, last[i], i, &val)) != SKIPLIST_OK)
            goto fail;
        if (val != 0) {
            r = skiplist_damaged(sl, last[i], "last forward pointer of a level is not null");
            goto fail;
        }
    }
    *list_r = list;
    *n_r = count;
    return SKIPLIST_OK;
fail:
    free(list);
    return r;
}

int skiplist_consistent(struct skiplist *sl)
{
    uint32_t *list = NULL, *live = NULL, end;
    size_t n = 0, nlive = 0, i;
    int r;

    if ((r = skiplist_read_lock(sl)) != SKIPLIST_OK)
        return r;
    if (sl->size == 0)
        goto out;
    if (sl->use_view) {
        /* awaiting recovery: the records replayed fine (the view exists) */
        log_info("skiplist: consistency check of a file awaiting recovery file=<%s>", sl->fname);
        goto out;
    }
    if ((r = skiplist_check_links(sl, &list, &n)) != SKIPLIST_OK)
        goto out;
    if ((r = skiplist_replay(sl, &live, &nlive, &end)) != SKIPLIST_OK)
        goto out;
    if (end != sl->size) {
        r = skiplist_damaged(sl, end, "log does not end in a commit");
        goto out;
    }
    if (nlive != n) {
        log_error("skiplist: linked records differ from the log file=<%s> linked=<%zu> replayed=<%zu>",
                  sl->fname, n, nlive);
        r = SKIPLIST_IOERROR;
        goto out;
    }
    for (i = 0; i < n; i++) {
        if (list[i] != live[i]) {
            r = skiplist_damaged(sl, list[i], "linked record differs from the log");
            goto out;
        }
    }
out:
    free(list);
    free(live);
    skiplist_read_unlock(sl);
    return r;
}

static void skiplist_escape(FILE *out, const char *s, size_t len)
{
    size_t i;

    for (i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c < 0x20 || c == 0x7f || c == '\\' || c >= 0x80)
            fprintf(out, "\\x%02x", c);
        else
            fputc(c, out);
    }
}

static int skiplist_dump_structure(struct skiplist *sl, FILE *out)
{
    struct skiplist_node n;
    uint32_t off, i, type, len;

    fprintf(out, "skiplist file=%s size=%zu version=%u.%u maxlevel=%u curlevel=%u "
            "listsize=%u logstart=%u last_recovery=%u\n", sl->fname, sl->size,
            skiplist_get32(sl->map + SKIPLIST_OFF_VERSION),
            skiplist_get32(sl->map + SKIPLIST_OFF_VERSION_MINOR), sl->maxlevel,
            sl->curlevel, sl->listsize, sl->logstart, sl->last_recovery);
    for (off = SKIPLIST_DUMMY_OFFSET; off < sl->size; off += len) {
        type = skiplist_get32(sl->map + off);
        if (type == SKIPLIST_T_DUMMY || type == SKIPLIST_T_INORDER || type == SKIPLIST_T_ADD) {
            if (skiplist_parse_node(sl, off, &n) < 0)
                goto bad;
            fprintf(out, "%08X: %s kl=%u dl=%u lvl=%u key=", off,
                    type == SKIPLIST_T_DUMMY ? "DUMMY" :
                    type == SKIPLIST_T_INORDER ? "INORDER" : "ADD",
                    n.keylen, n.datalen, n.level);
            skiplist_escape(out, n.key, n.keylen);
            fputs("\n\t", out);
            for (i = 0; i < n.level; i++)
                fprintf(out, "%08X ", skiplist_fwd(sl, &n, i));
            fputc('\n', out);
            len = n.size;
        } else if (skiplist_parse_logrec(sl, off, &type, &len) == 0) {
            if (type == SKIPLIST_T_DELETE)
                fprintf(out, "%08X: DELETE offset=%08X\n", off,
                        skiplist_get32(sl->map + off + 4));
            else
                fprintf(out, "%08X: COMMIT\n", off);
        } else {
            goto bad;
        }
    }
    return SKIPLIST_OK;
bad:
    fprintf(out, "%08X: unparseable (%zu bytes to the end)\n", off, sl->size - off);
    return skiplist_damaged(sl, off, "unparseable record in dump");
}

/* qsort order for records of a file without SKIPLIST_MBOXSORT: the API's
 * plain byte order, cyrusdb_compare(0). */
static int skiplist_record_apicmp(const void *a, const void *b)
{
    const struct skiplist_record *ra = a, *rb = b;

    return cyrusdb_compare(0, ra->key, ra->keylen, rb->key, rb->keylen);
}

int skiplist_dump(struct skiplist *sl, FILE *out, int detail)
{
    struct skiplist_record rec, *recs = NULL;
    struct buf key = BUF_INITIALIZER;
    size_t nrecs = 0, alloc = 0, i;
    int reorder = 0;
    int r;

    if ((r = skiplist_read_lock(sl)) != SKIPLIST_OK)
        return r;
    if (sl->size == 0) {
        skiplist_read_unlock(sl);
        return SKIPLIST_OK;
    }
    if (detail) {
        r = skiplist_dump_structure(sl, out);
        skiplist_read_unlock(sl);
        return r;
    }
    /* The records point into the map, which stays put under the lock.
     * They are printed in cyrusdb_compare() order: the file's order unless
     * a key holds a byte the file orders differently (see skiplist_cmp). */
    r = skiplist_seek(sl, NULL, 0, 0, &rec);
    while (r == SKIPLIST_OK) {
        if (nrecs == alloc) {
            size_t na = alloc ? alloc * 2 : 64;
            struct skiplist_record *nr = realloc(recs, na * sizeof(*recs));

            if (!nr) {
                errno = ENOMEM;
                r = skiplist_syserr(sl, "malloc");
                break;
            }
            recs = nr;
            alloc = na;
        }
        recs[nrecs++] = rec;
        reorder |= skiplist_key_reorders(sl, rec.key, rec.keylen);
        if (buf_setmap(&key, rec.key, rec.keylen) < 0) {
            errno = ENOMEM;
            r = skiplist_syserr(sl, "malloc");
            break;
        }
        r = skiplist_seek(sl, key.s, key.len, 1, &rec);
    }
    if (r == SKIPLIST_NOTFOUND) {
        r = SKIPLIST_OK;
        if (reorder)
            qsort(recs, nrecs, sizeof(*recs), skiplist_record_apicmp);
        for (i = 0; i < nrecs; i++) {
            skiplist_escape(out, recs[i].key, recs[i].keylen);
            fputc('\t', out);
            skiplist_escape(out, recs[i].data, recs[i].datalen);
            fputc('\n', out);
        }
    }
    free(recs);
    buf_free(&key);
    skiplist_read_unlock(sl);
    return r;
}
