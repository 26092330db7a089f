/*
 * append.c - staging a message and appending it to mailboxes (append.h).
 *
 * Staging.  A message is written once, into a staging file
 *   PARTITION/stage./NN/PID-SEQ-TIME
 * where NN is getpid() mod stage_dirs in lower-case hex, at least two
 * digits ("00" .. "0f" for the default 16; three digits when stage_dirs
 * passes 256), PID the writer's process id, SEQ a per-process counter and
 * TIME the creation time in seconds.  Concurrent delivery processes thus
 * create and unlink their files in different directories and do not queue
 * on one directory's lock (the field reports in the design notes: one
 * queue directory per concurrent writer).  The directories are created on
 * demand.  The file is created O_CREAT|O_EXCL, mode 0600, and written
 * through a 64 KiB buffer; the size, the header size (bytes up to and
 * including the first empty line, CRLF CRLF or LF LF, tracked across write
 * boundaries by a small state machine) and the SHA-1 digest (OpenSSL's
 * SHA1_* functions; why not EVP: below the type definitions) are
 * computed while the bytes pass.  Nothing is synced while staging: the
 * commit round of append_commit() syncs the staging file, whose inode is
 * the inode of every mailbox's hard link to it.
 *
 * Single-instance store per partition: every mailbox on the stage's
 * partition gets a hard link to the staging file (mailbox.c); a mailbox on
 * another partition gets a link to a copy of the staging file made once
 * per partition (the copy is a staging file on that partition, named and
 * removed like the first).
 *
 * Appending.  append_add() checks quota, reserves the message in the
 * mailbox (uid, link, PENDING record: mailbox_append_reserve()) and puts
 * the staging file's descriptor into the transaction's commit batch;
 * append_commit() runs ONE sync round for everything reserved and then
 * makes every record visible with one mailbox_append_finish_many() (all
 * the mailboxes locked together, ONE quota transaction for all of them),
 * or cancels every reservation when the round failed.  The durability
 * argument (why a crash at any instant leaves each message absent or
 * complete, and never loses an acknowledged one) is at the top of
 * commit.c.
 *
 * Invariants: a stage's descriptors stay open until append_stage_free();
 * a transaction's batch holds only descriptors of stages and mailboxes
 * that the caller keeps open until the transaction is committed, aborted
 * or freed; a transaction's reservation list holds exactly the uids that
 * are PENDING under this process's record locks.
 */
#include "config.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* SHA1_Init/_Update/_Final are deprecated in OpenSSL 3 in favour of EVP;
 * they are still part of its API, and used here on purpose (below). */
#define OPENSSL_SUPPRESS_DEPRECATED 1
#include <openssl/sha.h>

#include "lib/buf.h"
#include "lib/fsutil.h"
#include "lib/log.h"
#include "lib/procid.h"
#include "store/append.h"
#include "store/commit.h"
#include "store/journal.h"
#include "store/quota.h"
#include "store/store.h"

#define APPEND_WBUF_SIZE (64 * 1024)
#define APPEND_MAX_SIZE 0xffffffffULL      /* 4 GiB - 1: sizes are 32-bit */
#define APPEND_CREATE_TRIES 16
#define APPEND_STAGE_DIR "stage."
#define APPEND_DIR_MODE 0750
#define APPEND_FILE_MODE 0600

/* Where the header scan stands (bytes seen so far). */
enum append_hdr_state {
    APPEND_HDR_LINE_START = 0,  /* at the start of a line (or message) */
    APPEND_HDR_CR_START,        /* a CR at the start of a line */
    APPEND_HDR_MID_LINE,        /* inside a line */
    APPEND_HDR_DONE             /* the empty line was seen */
};

/* One staging file. */
struct append_part {
    char *partition;   /* partition name */
    char *path;        /* the staging file */
    int fd;            /* open read-write until append_stage_free() */
};

struct append_stage {
    const struct imapconf *conf;
    struct append_part *parts;   /* [0]: the file written; then copies */
    size_t nparts, parts_alloc;
    SHA_CTX sha;                 /* SHA-1 of the bytes accepted so far */
    uint64_t size;               /* bytes accepted so far */
    uint64_t limit;              /* largest size allowed */
    uint64_t header_size;        /* valid when hdr == APPEND_HDR_DONE */
    enum append_hdr_state hdr;
    char *wbuf;                  /* bytes not yet written to parts[0] */
    size_t wlen;
    int error;                   /* sticky: a failed write or TOOBIG */
    int closed;
    int whole;                   /* closed with every byte still in wbuf
                                    (kept for the journal record and
                                    for append_stage_bytes()) */
    struct mailbox_msginfo info; /* filled by append_stage_close() */
};

struct append_resv {
    struct mailbox *mb;
    uint32_t uid;
    /* for the journal record (spool_sync: journal) */
    int fd;                      /* the staging file linked */
    const struct append_stage *st;
    int64_t internaldate;
    uint32_t sysflags;
    char **keywords;
    size_t nkeywords;
};

struct append_txn {
    const struct imapconf *conf;
    struct commit_batch *batch;  /* NULL only after a failed reset */
    struct append_resv *resv;    /* reserved, not yet finished/cancelled */
    size_t nresv, resv_alloc;
};

static unsigned long append_seq;

/*
 * Why SHA1_* and not EVP: the first EVP digest of a process initializes
 * OpenSSL's provider machinery (reads openssl.cnf, registers every
 * algorithm of the default provider in hash tables), about 6 million
 * instructions, twice what exec'ing lmtpd and linking its libraries
 * costs; and every EVP_DigestInit_ex() with EVP_sha1() looks the algorithm
 * up again in the method store under a lock.  A storm that makes the
 * master start 90 lmtpd workers paid that 90 times, as much CPU as
 * storing about a thousand messages.  The low-level functions run the same
 * assembly (SHA instructions where the CPU has them) with the context
 * inside the stage: no initialization, no allocation, no lock.
 */

/* errno of a failed file operation -> store code. */
static int append_errno(int e)
{
    return (e == ENOSPC || e == EDQUOT) ? STORE_NOSPACE : STORE_IOERROR;
}

/* ---------------------------------------------------------------------- */
/* staging files                                                          */

/* Create a new empty staging file on partition `partname` into *p. */
static int append_part_create(const struct imapconf *conf,
                              const char *partname, const char *linkfrom,
                              struct append_part *p)
{
    struct buf dir = BUF_INITIALIZER, path = BUF_INITIALIZER;
    const char *root;
    long ndirs;
    int tries, fd = -1, made_dir = 0, e, r;

    memset(p, 0, sizeof(*p));
    p->fd = -1;
    root = imapconf_partition(conf, partname);
    if (!root) {
        log_error("append: unknown partition partition=<%s>", partname);
        return STORE_BADPARTITION;
    }
    ndirs = imapconf_getint(conf, "stage_dirs");
    if (ndirs < 1)
        ndirs = 1;
    if (buf_printf(&dir, "%s/%s/%02lx", root, APPEND_STAGE_DIR,
                   (unsigned long)procid_get() % (unsigned long)ndirs) != 0) {
        r = STORE_NOMEM;
        goto out;
    }

    for (tries = 0; tries < APPEND_CREATE_TRIES; tries++) {
        buf_reset(&path);
        if (buf_printf(&path, "%s/%ld-%lu-%lld", buf_cstring(&dir),
                       (long)procid_get(), ++append_seq,
                       (long long)time(NULL)) != 0) {
            r = STORE_NOMEM;
            goto out;
        }
        if (!linkfrom)
            fd = open(buf_cstring(&path),
                      O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, APPEND_FILE_MODE);
        else if (link(linkfrom, buf_cstring(&path)) == 0) {
            fd = open(buf_cstring(&path), O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                e = errno;
                unlink(buf_cstring(&path));
                errno = e;
            }
        } else
            fd = -1;
        if (fd >= 0)
            break;
        e = errno;
        if (linkfrom && e != ENOENT && e != EEXIST && e != EINTR) {
            /* EXDEV, EMLINK, EPERM...: the caller copies instead */
            r = STORE_NOTIMPLEMENTED;
            goto out;
        }
        if (linkfrom && e == ENOENT && access(linkfrom, F_OK) != 0) {
            r = STORE_NOTFOUND;     /* the source went away */
            goto out;
        }
        if (e == ENOENT && !made_dir) {
            made_dir = 1;
            if (fs_mkdir_p(buf_cstring(&dir), APPEND_DIR_MODE) != 0) {
                e = errno;
                log_error("append: cannot create staging directory "
                          "dir=<%s> error=<%s>", buf_cstring(&dir),
                          strerror(e));
                r = append_errno(e);
                goto out;
            }
            continue;
        }
        if (e == EEXIST || e == EINTR)
            continue;   /* a leftover of an earlier process: next name */
        log_error("append: cannot create staging file file=<%s> error=<%s>",
                  buf_cstring(&path), strerror(e));
        r = append_errno(e);
        goto out;
    }
    if (fd < 0) {
        log_error("append: no free staging file name dir=<%s>",
                  buf_cstring(&dir));
        r = STORE_IOERROR;
        goto out;
    }
    p->partition = strdup(partname);
    if (!p->partition) {
        unlink(buf_cstring(&path));
        close(fd);
        r = STORE_NOMEM;
        goto out;
    }
    p->path = buf_release(&path);
    p->fd = fd;
    r = STORE_OK;
out:
    buf_free(&dir);
    buf_free(&path);
    return r;
}

/* Close and unlink a staging file. */
static void append_part_remove(struct append_part *p)
{
    if (p->fd >= 0)
        close(p->fd);
    if (p->path && unlink(p->path) != 0 && errno != ENOENT)
        log_warning("append: cannot remove staging file file=<%s> error=<%s>",
                    p->path, strerror(errno));
    free(p->path);
    free(p->partition);
    memset(p, 0, sizeof(*p));
    p->fd = -1;
}

/* A new stage whose parts[0] is a staging file on `partition` (NULL =
 * defaultpartition): created empty, or (linkfrom) a hard link of an
 * existing message file.  The caller sets up the rest. */
static int append_stage_new(const struct imapconf *conf, const char *partition,
                            const char *linkfrom, struct append_stage **st_r)
{
    struct append_stage *st;
    int r;

    *st_r = NULL;
    if (!partition)
        partition = imapconf_getstring(conf, "defaultpartition");
    if (!partition || !*partition)
        return STORE_BADPARTITION;
    st = calloc(1, sizeof(*st));
    if (!st)
        return STORE_NOMEM;
    st->conf = conf;
    st->limit = APPEND_MAX_SIZE;
    st->parts = calloc(2, sizeof(*st->parts));
    if (!st->parts) {
        free(st);
        return STORE_NOMEM;
    }
    st->parts_alloc = 2;
    r = append_part_create(conf, partition, linkfrom, &st->parts[0]);
    if (r) {
        free(st->parts);
        free(st);
        return r;
    }
    st->nparts = 1;
    *st_r = st;
    return STORE_OK;
}

int append_stage_open(const struct imapconf *conf, const char *partition,
                      struct append_stage **st_r)
{
    struct append_stage *st;
    long maxsize;
    int r;

    r = append_stage_new(conf, partition, NULL, &st);
    if (r)
        return r;
    st->wbuf = malloc(APPEND_WBUF_SIZE);
    if (!st->wbuf) {
        append_stage_free(&st);
        return STORE_NOMEM;
    }
    if (SHA1_Init(&st->sha) != 1) {
        log_error("append: SHA-1 unavailable");
        append_stage_free(&st);
        return STORE_INTERNAL;
    }
    maxsize = imapconf_getint(conf, "maxmessagesize");
    if (maxsize > 0 && (unsigned long long)maxsize < st->limit)
        st->limit = (uint64_t)maxsize;
    *st_r = st;
    return STORE_OK;
}

int append_stage_link(const struct imapconf *conf, const char *partition,
                      const char *msgpath, const struct mailbox_msginfo *info,
                      struct append_stage **st_r)
{
    struct append_stage *st;
    int r;

    *st_r = NULL;
    r = append_stage_new(conf, partition, msgpath, &st);
    if (r)
        return r;
    st->info = *info;
    st->size = info->size;
    st->header_size = info->header_size;
    st->hdr = APPEND_HDR_DONE;
    st->closed = 1;
    *st_r = st;
    return STORE_OK;
}

/* Write the buffered bytes to the staging file. */
static int append_stage_flush(struct append_stage *st)
{
    int e;

    if (st->wlen == 0)
        return STORE_OK;
    if (fs_write_all(st->parts[0].fd, st->wbuf, st->wlen) != 0) {
        e = errno;
        log_error("append: staging write failed file=<%s> error=<%s>",
                  st->parts[0].path, strerror(e));
        st->error = append_errno(e);
        return st->error;
    }
    st->wlen = 0;
    return STORE_OK;
}

/* Advance the header scan over (p, len), which start at offset `base`. */
static void append_scan_header(struct append_stage *st, const unsigned char *p,
                               size_t len, uint64_t base)
{
    enum append_hdr_state s = st->hdr;
    size_t i;

    for (i = 0; i < len && s != APPEND_HDR_DONE; i++) {
        unsigned char c = p[i];

        switch (s) {
        case APPEND_HDR_LINE_START:
            if (c == '\n') {
                s = APPEND_HDR_DONE;          /* LF LF (or LF at start) */
                st->header_size = base + i + 1;
            } else if (c == '\r') {
                s = APPEND_HDR_CR_START;
            } else {
                s = APPEND_HDR_MID_LINE;
            }
            break;
        case APPEND_HDR_CR_START:
            if (c == '\n') {
                s = APPEND_HDR_DONE;          /* CRLF CRLF */
                st->header_size = base + i + 1;
            } else {
                s = APPEND_HDR_MID_LINE;      /* "\r" then more: not empty */
            }
            break;
        case APPEND_HDR_MID_LINE:
            if (c == '\n')
                s = APPEND_HDR_LINE_START;
            break;
        case APPEND_HDR_DONE:
            break;
        }
    }
    st->hdr = s;
}

int append_stage_write(struct append_stage *st, const void *data, size_t len)
{
    const unsigned char *p = data;
    int r;

    if (st->error)
        return st->error;
    if (st->closed)
        return STORE_INTERNAL;
    if (len == 0)
        return STORE_OK;
    if ((uint64_t)len > st->limit - st->size) {
        log_info("append: message too big limit=<%llu> file=<%s>",
                 (unsigned long long)st->limit, st->parts[0].path);
        st->error = STORE_TOOBIG;
        return st->error;
    }
    if (st->hdr != APPEND_HDR_DONE)
        append_scan_header(st, p, len, st->size);
    if (SHA1_Update(&st->sha, p, len) != 1) {
        st->error = STORE_INTERNAL;
        return st->error;
    }
    st->size += len;

    if (st->wlen + len <= APPEND_WBUF_SIZE) {
        memcpy(st->wbuf + st->wlen, p, len);
        st->wlen += len;
        return STORE_OK;
    }
    if ((r = append_stage_flush(st)) != STORE_OK)
        return r;
    if (len >= APPEND_WBUF_SIZE) {
        if (fs_write_all(st->parts[0].fd, p, len) != 0) {
            int e = errno;

            log_error("append: staging write failed file=<%s> error=<%s>",
                      st->parts[0].path, strerror(e));
            st->error = append_errno(e);
            return st->error;
        }
        return STORE_OK;
    }
    memcpy(st->wbuf, p, len);
    st->wlen = len;
    return STORE_OK;
}

int append_stage_close(struct append_stage *st)
{
    int r;

    if (st->error)
        return st->error;
    if (st->closed)
        return STORE_INTERNAL;
    /* all of the message still in the buffer: it stays there, for the
     * journal record (append_commit_journal, which then needs neither a
     * read back nor a checksum of its own) and for readers of the
     * closed message (append_stage_bytes: Sieve reads no file) */
    st->whole = st->wlen == st->size;
    if ((r = append_stage_flush(st)) != STORE_OK)
        return r;
    if (SHA_DIGEST_LENGTH != MAILBOX_DIGEST_LEN ||
        SHA1_Final(st->info.digest, &st->sha) != 1) {
        st->error = STORE_INTERNAL;
        return st->error;
    }
    st->info.size = (uint32_t)st->size;
    st->info.header_size = (uint32_t)(st->hdr == APPEND_HDR_DONE ?
                                      st->header_size : st->size);
    st->closed = 1;
    if (!st->whole) {
        free(st->wbuf);
        st->wbuf = NULL;
    }
    return STORE_OK;
}

void append_stage_allow_extra(struct append_stage *st, size_t extra)
{
    if (!st) return;
    if ((uint64_t)extra > APPEND_MAX_SIZE - st->limit)
        st->limit = APPEND_MAX_SIZE;
    else
        st->limit += (uint64_t)extra;
}

const struct mailbox_msginfo *append_stage_info(const struct append_stage *st)
{
    return &st->info;
}

const char *append_stage_path(const struct append_stage *st)
{
    return st->nparts ? st->parts[0].path : NULL;
}

const void *append_stage_bytes(const struct append_stage *st, size_t *len_r)
{
    if (!st->closed || !st->whole || !st->wbuf)
        return NULL;
    *len_r = (size_t)st->size;
    return st->wbuf;
}

void append_stage_free(struct append_stage **stp)
{
    struct append_stage *st = *stp;
    size_t i;

    if (!st)
        return;
    for (i = 0; i < st->nparts; i++)
        append_part_remove(&st->parts[i]);
    free(st->parts);
    free(st->wbuf);
    free(st);
    *stp = NULL;
}

/* Copy the (closed) staging file parts[0] into the new staging file *to. */
static int append_part_copy(struct append_stage *st, struct append_part *to)
{
    const struct append_part *from = &st->parts[0];
    char *chunk;
    uint64_t off = 0;
    ssize_t n;
    int e, r = STORE_OK;

    chunk = malloc(APPEND_WBUF_SIZE);
    if (!chunk)
        return STORE_NOMEM;
    while (off < st->size) {
        size_t want = st->size - off < APPEND_WBUF_SIZE ?
                      (size_t)(st->size - off) : APPEND_WBUF_SIZE;

        n = pread(from->fd, chunk, want, (off_t)off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            e = n < 0 ? errno : EIO;
            log_error("append: staging copy read failed file=<%s> "
                      "error=<%s>", from->path, strerror(e));
            r = STORE_IOERROR;
            break;
        }
        if (fs_write_all(to->fd, chunk, (size_t)n) != 0) {
            e = errno;
            log_error("append: staging copy write failed file=<%s> "
                      "error=<%s>", to->path, strerror(e));
            r = append_errno(e);
            break;
        }
        off += (uint64_t)n;
    }
    free(chunk);
    return r;
}

/* The staging file on partition `partname`: parts[0] when it is the
 * stage's own partition, else a copy made on first use. */
static int append_stage_part(struct append_stage *st, const char *partname,
                             struct append_part **p_r)
{
    struct append_part *p;
    size_t i;
    int r;

    for (i = 0; i < st->nparts; i++)
        if (strcasecmp(st->parts[i].partition, partname) == 0) {
            *p_r = &st->parts[i];
            return STORE_OK;
        }
    if (st->nparts == st->parts_alloc) {
        size_t nalloc = st->parts_alloc * 2;

        p = realloc(st->parts, nalloc * sizeof(*p));
        if (!p)
            return STORE_NOMEM;
        st->parts = p;
        st->parts_alloc = nalloc;
    }
    p = &st->parts[st->nparts];
    r = append_part_create(st->conf, partname, NULL, p);
    if (r)
        return r;
    r = append_part_copy(st, p);
    if (r) {
        append_part_remove(p);
        return r;
    }
    st->nparts++;
    *p_r = p;
    return STORE_OK;
}

/* ---------------------------------------------------------------------- */
/* transactions                                                           */

int append_begin(const struct imapconf *conf, struct append_txn **t_r)
{
    struct append_txn *t;
    int r;

    *t_r = NULL;
    t = calloc(1, sizeof(*t));
    if (!t)
        return STORE_NOMEM;
    t->conf = conf;
    r = commit_batch_new(conf, &t->batch);
    if (r) {
        free(t);
        return r;
    }
    *t_r = t;
    return STORE_OK;
}

/* Drop whatever the batch holds without syncing (nothing it covers is
 * reserved any more). */
static void append_batch_reset(struct append_txn *t)
{
    commit_batch_free(&t->batch);
    if (commit_batch_new(t->conf, &t->batch) != STORE_OK)
        t->batch = NULL;   /* append_add() tries again */
}

static void append_cancel_one(const struct append_resv *rv)
{
    int r = mailbox_append_cancel(rv->mb, rv->uid);

    if (r)
        log_error("append: cancel failed mailbox=<%s> uid=<%u> error=<%s>",
                  mailbox_name(rv->mb), rv->uid, store_strerror(r));
}

/* Keep copies of the keywords for the journal record (none kept when
 * memory is short: the journal is then not used for this commit). */
static void append_resv_keywords(struct append_resv *rv,
                                 const char *const *keywords, size_t n)
{
    size_t i;

    rv->keywords = calloc(n, sizeof(char *));
    if (!rv->keywords)
        return;
    for (i = 0; i < n; i++)
        if (keywords[i] && !(rv->keywords[rv->nkeywords++] =
                                 strdup(keywords[i])))
            rv->nkeywords--;
}

static void append_resv_clear(struct append_txn *t)
{
    size_t i, k;

    for (i = 0; i < t->nresv; i++) {
        for (k = 0; k < t->resv[i].nkeywords; k++)
            free(t->resv[i].keywords[k]);
        free(t->resv[i].keywords);
        t->resv[i].keywords = NULL;
        t->resv[i].nkeywords = 0;
    }
    t->nresv = 0;
}

/*
 * spool_sync: journal: one journal record for the transaction's
 * reservations instead of the batch's round (journal.h).  STORE_OK: durable;
 * STORE_NOTIMPLEMENTED: not possible here (several staging files, the
 * journal unusable): the caller runs the round; else the round's error.
 */
static int append_commit_journal(struct append_txn *t)
{
    struct journal_entry *ents;
    const struct mailbox_header *h;
    const char *partname;
    size_t i;
    int r;

    for (i = 1; i < t->nresv; i++)
        if (t->resv[i].fd != t->resv[0].fd)
            return STORE_NOTIMPLEMENTED;
    ents = calloc(t->nresv, sizeof(*ents));
    if (!ents)
        return STORE_NOTIMPLEMENTED;
    partname = mailbox_partition(t->resv[0].mb);
    if (!partname || !*partname)
        partname = imapconf_getstring(t->conf, "defaultpartition");
    for (i = 0; i < t->nresv; i++) {
        const struct append_resv *rv = &t->resv[i];

        h = mailbox_get_header(rv->mb);
        ents[i].mailbox = mailbox_name(rv->mb);
        ents[i].partition = mailbox_partition(rv->mb);
        ents[i].uid = rv->uid;
        ents[i].uidvalidity = h->uidvalidity;
        ents[i].compactions = h->compactions;
        ents[i].sysflags = rv->sysflags;
        ents[i].internaldate = rv->internaldate;
        ents[i].info = rv->st->info;
        ents[i].keywords = (const char *const *)rv->keywords;
        ents[i].nkeywords = rv->nkeywords;
    }
    r = journal_commit(t->conf, partname, t->resv[0].fd,
                       t->resv[0].st->whole ? t->resv[0].st->wbuf : NULL,
                       t->resv[0].st->info.size, ents, t->nresv);
    free(ents);
    return r;
}

int append_add(struct append_txn *t, struct mailbox *mb,
               struct append_stage *st, int64_t internaldate,
               uint32_t sysflags, int flags, uint32_t *uid_r)
{
    return append_add_keywords(t, mb, st, internaldate, sysflags, NULL, 0,
                               flags, uid_r);
}

int append_add_keywords(struct append_txn *t, struct mailbox *mb,
                        struct append_stage *st, int64_t internaldate,
                        uint32_t sysflags, const char *const *keywords,
                        size_t nkeywords, int flags, uint32_t *uid_r)
{
    struct append_part *part;
    const char *partname;
    uint32_t uid = 0;
    int r;

    if (uid_r)
        *uid_r = 0;
    if (!t || !mb || !st)
        return STORE_INTERNAL;
    if (st->error)
        return st->error;
    if (!st->closed || (sysflags & ~MAILBOX_SYSTEM_FLAGS))
        return STORE_INTERNAL;
    if (!t->batch && commit_batch_new(t->conf, &t->batch) != STORE_OK)
        return STORE_NOMEM;
    if (t->nresv == t->resv_alloc) {
        size_t nalloc = t->resv_alloc ? t->resv_alloc * 2 : 8;
        struct append_resv *nr = realloc(t->resv, nalloc * sizeof(*nr));

        if (!nr)
            return STORE_NOMEM;
        t->resv = nr;
        t->resv_alloc = nalloc;
    }

    if (!(flags & APPEND_IGNORE_QUOTA)) {
        struct quota_db *q;

        r = quota_shared(t->conf, &q);
        if (r) {
            log_error("append: quota database unavailable error=<%s>",
                      store_strerror(r));
            return r;
        }
        r = quota_check(q, mailbox_name(mb), st->info.size, 1, NULL);
        if (r)
            return r;
    }

    partname = mailbox_partition(mb);
    if (!partname || !*partname)
        partname = imapconf_getstring(t->conf, "defaultpartition");
    r = append_stage_part(st, partname, &part);
    if (r)
        return r;

    if (internaldate == 0)
        internaldate = (int64_t)time(NULL);
    r = mailbox_append_reserve_keywords(mb, part->path, &st->info,
                                        internaldate, sysflags, keywords,
                                        nkeywords,
                                        (flags & APPEND_KEYWORDS_STRICT) != 0,
                                        t->batch, &uid);
    if (r)
        return r;
    r = commit_batch_add_fd(t->batch, part->fd);
    if (r) {
        struct append_resv rv;

        memset(&rv, 0, sizeof(rv));
        rv.mb = mb;
        rv.uid = uid;
        append_cancel_one(&rv);
        return r;
    }
    memset(&t->resv[t->nresv], 0, sizeof(t->resv[t->nresv]));
    t->resv[t->nresv].mb = mb;
    t->resv[t->nresv].uid = uid;
    t->resv[t->nresv].fd = part->fd;
    t->resv[t->nresv].st = st;
    t->resv[t->nresv].internaldate = internaldate;
    t->resv[t->nresv].sysflags = sysflags;
    if (nkeywords && journal_mode(t->conf))
        append_resv_keywords(&t->resv[t->nresv], keywords, nkeywords);
    t->nresv++;
    if (uid_r)
        *uid_r = uid;
    return STORE_OK;
}

int append_check_quota(struct append_txn *t, struct mailbox *mb,
                       uint64_t bytes, uint64_t messages)
{
    struct quota_db *q;
    int r;

    if (!t || !mb)
        return STORE_INTERNAL;
    r = quota_shared(t->conf, &q);
    if (r) {
        log_error("append: quota database unavailable error=<%s>",
                  store_strerror(r));
        return r;
    }
    return quota_check(q, mailbox_name(mb), bytes, messages, NULL);
}

int append_commit(struct append_txn *t)
{
    struct mailbox **mbs = NULL;
    uint32_t *uids = NULL;
    int *rs = NULL;
    size_t i;
    int r, first = STORE_OK;

    if (!t)
        return STORE_INTERNAL;
    if (t->nresv == 0) {
        append_batch_reset(t);
        return STORE_OK;
    }
    r = journal_mode(t->conf) ? append_commit_journal(t)
                              : STORE_NOTIMPLEMENTED;
    if (r == STORE_OK)
        append_batch_reset(t);      /* the journal record made it durable */
    else if (r == STORE_NOTIMPLEMENTED)
        r = commit_batch_sync(t->batch);
    if (r) {
        log_error("append: commit failed messages=<%zu> error=<%s>",
                  t->nresv, store_strerror(r));
        for (i = 0; i < t->nresv; i++)
            append_cancel_one(&t->resv[i]);
        append_resv_clear(t);
        append_batch_reset(t);
        return r;
    }
    /* all reservations at once: every mailbox locked in the global order,
     * one quota transaction for all of them (mailbox.h) */
    mbs = calloc(t->nresv, sizeof(*mbs));
    uids = calloc(t->nresv, sizeof(*uids));
    rs = calloc(t->nresv, sizeof(*rs));
    if (mbs && uids && rs) {
        for (i = 0; i < t->nresv; i++) {
            mbs[i] = t->resv[i].mb;
            uids[i] = t->resv[i].uid;
        }
        (void)mailbox_append_finish_many(mbs, uids, t->nresv, rs);
    } else if (rs) {
        for (i = 0; i < t->nresv; i++)
            rs[i] = mailbox_append_finish(t->resv[i].mb, t->resv[i].uid);
    }
    for (i = 0; i < t->nresv; i++) {
        r = rs ? rs[i]
               : mailbox_append_finish(t->resv[i].mb, t->resv[i].uid);
        if (r) {
            /* durable but not made visible: give it up rather than
             * acknowledge something readers cannot see */
            log_error("append: finish failed mailbox=<%s> uid=<%u> "
                      "error=<%s>", mailbox_name(t->resv[i].mb),
                      t->resv[i].uid, store_strerror(r));
            append_cancel_one(&t->resv[i]);
            if (first == STORE_OK)
                first = r;
        }
    }
    free(mbs);
    free(uids);
    free(rs);
    append_resv_clear(t);
    return first;
}

void append_abort(struct append_txn *t)
{
    size_t i;

    if (!t)
        return;
    for (i = 0; i < t->nresv; i++)
        append_cancel_one(&t->resv[i]);
    append_resv_clear(t);
    append_batch_reset(t);
}

void append_free(struct append_txn **tp)
{
    struct append_txn *t = *tp;

    if (!t)
        return;
    if (t->nresv)
        append_abort(t);
    commit_batch_free(&t->batch);
    free(t->resv);
    free(t);
    *tp = NULL;
}

/* ---- leftover staging files ------------------------------------------ */

/* Is the staging file `name` (PID-SEQ-TIME) in `dir` to be removed: its
 * writer is gone, or it is older than max_age seconds? */
static int append_stage_stale(const char *dir, const char *name, long max_age,
                              time_t now)
{
    char path[4096];
    struct stat st;
    char *end;
    long pid;

    errno = 0;
    pid = strtol(name, &end, 10);
    if (errno || end == name || *end != '-' || pid <= 0)
        return 0;   /* not ours: leave it */
    if (snprintf(path, sizeof(path), "%s/%s", dir, name) >= (int)sizeof(path))
        return 0;
    if (lstat(path, &st) != 0 || !S_ISREG(st.st_mode))
        return 0;
    if (now - st.st_mtime > max_age)
        return 1;
    if ((pid_t)pid == getpid())
        return 0;
    return kill((pid_t)pid, 0) != 0 && errno == ESRCH;
}

int append_stage_cleanup(const struct imapconf *conf, const char *partition,
                         long max_age, unsigned long *removed_r)
{
    struct buf top = BUF_INITIALIZER, sub = BUF_INITIALIZER,
               path = BUF_INITIALIZER;
    const char *root;
    DIR *d = NULL, *sd;
    struct dirent *de, *fe;
    time_t now = time(NULL);
    int r = STORE_OK;

    if (removed_r)
        *removed_r = 0;
    if (!partition)
        partition = imapconf_getstring(conf, "defaultpartition");
    root = imapconf_partition(conf, partition);
    if (!root)
        return STORE_BADPARTITION;
    if (buf_printf(&top, "%s/%s", root, APPEND_STAGE_DIR) != 0)
        return STORE_NOMEM;
    d = opendir(buf_cstring(&top));
    if (!d) {
        r = errno == ENOENT ? STORE_OK : append_errno(errno);
        goto out;
    }
    while ((de = readdir(d)) != NULL) {
        if (de->d_name[0] == '.')
            continue;
        buf_reset(&sub);
        buf_printf(&sub, "%s/%s", buf_cstring(&top), de->d_name);
        sd = opendir(buf_cstring(&sub));
        if (!sd)
            continue;   /* not a directory */
        while ((fe = readdir(sd)) != NULL) {
            if (fe->d_name[0] == '.' ||
                !append_stage_stale(buf_cstring(&sub), fe->d_name, max_age, now))
                continue;
            buf_reset(&path);
            buf_printf(&path, "%s/%s", buf_cstring(&sub), fe->d_name);
            if (unlink(buf_cstring(&path)) == 0) {
                if (removed_r)
                    (*removed_r)++;
                log_info("append: removed leftover staging file path=<%s>",
                         buf_cstring(&path));
            } else if (errno != ENOENT) {
                log_error("append: cannot remove staging file path=<%s> "
                          "error=<%s>", buf_cstring(&path), strerror(errno));
                r = append_errno(errno);
            }
        }
        closedir(sd);
    }
out:
    if (d)
        closedir(d);
    buf_free(&top);
    buf_free(&sub);
    buf_free(&path);
    return r;
}
