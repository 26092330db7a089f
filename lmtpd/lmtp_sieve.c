/*
 * lmtp_sieve.c - each recipient's active Sieve script at delivery (see
 * lmtp_sieve.h).
 *
 * deliver.db keys of this module (store/duplicate.h: ID NUL MAILBOX; the
 * stored time is the moment the memory ends, so that a check is "stored
 * time > now"):
 *   "sieve-vacation:" SENDER ":" HANDLE   NUL USERID   (RFC 5230 4.2)
 *   "sieve-redirect:" MESSAGE-ID          NUL ADDRESS  (redirect loops)
 *   "sieve-duplicate:" ID                 NUL USERID   (RFC 7352)
 * They cannot collide with the delivery records (whose ids are
 * Message-IDs, "<...>").
 *
 * The compiled-script cache holds active and included scripts alike;
 * an entry used by the execution in progress is never evicted, so the
 * scripts on the library's include stack stay valid (and the library
 * can tell a loop by their identity).
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "lib/fsutil.h"
#include "lib/log.h"
#include "lmtpd/lmtp_sieve.h"
#include "lmtpd/lmtp_smtp.h"

extern char **environ;
#include "sieve/sieve.h"
#include "sieve/sieve_bc.h"
#include "sieve/sieve_msg.h"
#include "store/acl.h"
#include "store/duplicate.h"
#include "store/mailbox.h"
#include "store/mboxlist.h"
#include "store/mboxname.h"
#include "store/sievedir.h"
#include "store/store.h"

#define LMTP_SIEVE_TRACE "X-Sieve-Redirected-By"
#define LMTP_SIEVE_KEY_MAX 400
#define LMTP_SIEVE_SENDMAIL_ARGS 16   /* words of the sendmail key */

/* A compiled text, shared by every cache entry whose file holds the same
 * bytes (users with identical scripts, as a webmail's filter editor
 * writes them, compile once per process).  At most LMTP_SIEVE_CACHE of
 * them are held (the trees are tens of times the text's size); the
 * files' entries are cheap and many more (LMTP_SIEVE_FILES). */
struct lmtp_sieve_compiled {
    char *text;                    /* the script's bytes, for comparison */
    size_t len;
    uint64_t hash;                 /* sieve_bc_hash() of the bytes */
    struct sieve_script *script;   /* NULL: the script does not compile */
    char *error;                   /* its compile error */
    char *bc;                      /* the stored form it was loaded
                                      from (lmtp_sieve_keep_bc(); NULL:
                                      compiled), for comparison by loads
                                      that do not read the text */
    size_t bclen;
    unsigned refs;                 /* cache entries pointing here */
    int probation;                 /* in the probation slot (below) */
    struct lmtp_sieve_compiled *prev, *next;   /* the hash's bucket */
};

/* the compiled texts' hash table: a miss looks at one short chain, not
 * at every text held (a walk over LMTP_SIEVE_CACHE scattered entries
 * took more time than loading the stored form it was looking for) */
#define LMTP_SIEVE_COMP_BUCKETS (2 * LMTP_SIEVE_CACHE)

/* Admission.  A text of its own per user is seldom used twice by one
 * worker (2,000 users' mail spread over 20 workers), and a tree kept for
 * each took fresh memory at every load: about seven page faults per
 * delivery, more than the load itself cost.  So a new compiled text of
 * an active script waits in a probation slot of one: it is kept (held
 * like any other) when it is used again before the next new text takes
 * the slot (another delivery to the user, another user's file with the
 * same bytes), or when its text was made before (its hash is among the
 * LMTP_SIEVE_GHOSTS last texts made, direct-mapped); otherwise the next
 * new text drops it, and the next tree is carved from the memory it
 * leaves.  Included scripts are always kept. */
#define LMTP_SIEVE_GHOSTS 4096

/* A script file as last seen: found by (device, inode) through a hash
 * table, valid while its size, mtime and ctime are unchanged (a rename,
 * which changes the name an active link's target has, changes ctime). */
struct lmtp_sieve_cached {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime, ctime;
    struct lmtp_sieve_compiled *comp;
    char *name;                    /* the active link's target, as read
                                      when the entry was made (NULL for
                                      included scripts) */
    unsigned long used;
    uint32_t chain;                /* next entry of the bucket, +1; 0 end */
    int valid;
    int ref;                       /* used since the clock hand passed */
};

#define LMTP_SIEVE_BUCKETS (2 * LMTP_SIEVE_FILES)

struct lmtp_sieve {
    const struct imapconf *conf;
    struct deliver_ctx *dctx;
    struct sieve_limits limits;
    struct strarray allowed;
    uint32_t extmask;              /* allowed as the compiled form's mask */
    struct lmtp_sieve_cached *cache;   /* LMTP_SIEVE_FILES entries */
    uint32_t *buckets;             /* LMTP_SIEVE_BUCKETS: entry index + 1 */
    size_t hand;                   /* the clock's next candidate */
    struct lmtp_sieve_compiled *comps[LMTP_SIEVE_COMP_BUCKETS];
    size_t ncomps;                 /* compiled texts held */
    uint32_t probation;            /* the entry (index + 1) whose
                                      compiled text is on probation;
                                      0 none */
    uint64_t *ghosts;              /* LMTP_SIEVE_GHOSTS hashes of texts
                                      made (0 none) */
    unsigned long tick;
    unsigned long run_tick;        /* tick when the current run began:
                                      entries used since are in use */
    unsigned long compiles;
    unsigned long bcloads;         /* compiled forms loaded (NAME.bc) */
    int bc_quiet;                  /* a compiled form could not be
                                      written: say so once, not per miss */
    unsigned long seq;
    struct lmtp_smtp *smtp;        /* smtp_backend: host: the MTA */
    int smtp_host;                 /* smtp_backend is host */
    long timeout;                  /* lmtp_timeout, seconds */
    time_t zone_minute;            /* lmtp_sieve_zone(): the minute ... */
    int zone_offset;               /* ... its offset was found for */
    int zone_known;
};

/* Extensions whose actions this delivery path does not carry out: never
 * offered to scripts (none today; the list stays for the next one). */
static const char *const lmtp_sieve_unsupported[] = {
    NULL
};

static int lmtp_sieve_ext_ok(const char *name)
{
    size_t i;

    for (i = 0; lmtp_sieve_unsupported[i]; i++)
        if (strcmp(name, lmtp_sieve_unsupported[i]) == 0)
            return 0;
    return sieve_extension_supported(name);
}

int lmtp_sieve_new(const struct imapconf *conf, struct deliver_ctx *dctx,
                   struct lmtp_sieve **ls_r)
{
    struct lmtp_sieve *ls;
    const char *keys = imapconf_getstring(conf, "sieve_extensions");
    const char *const *all = sieve_extensions();
    size_t i;

    *ls_r = NULL;
    ls = calloc(1, sizeof(*ls));
    if (!ls)
        return -1;
    ls->cache = calloc(LMTP_SIEVE_FILES, sizeof(*ls->cache));
    ls->buckets = calloc(LMTP_SIEVE_BUCKETS, sizeof(*ls->buckets));
    ls->ghosts = calloc(LMTP_SIEVE_GHOSTS, sizeof(*ls->ghosts));
    if (!ls->cache || !ls->buckets || !ls->ghosts) {
        free(ls->cache);
        free(ls->buckets);
        free(ls->ghosts);
        free(ls);
        return -1;
    }
    ls->conf = conf;
    ls->dctx = dctx;
    sieve_limits_default(&ls->limits);
    ls->limits.max_script_size =
        (size_t)imapconf_getint(conf, "sieve_maxscriptsize") * 1024;
    if (keys && *keys) {
        struct strarray words = STRARRAY_INITIALIZER;

        strarray_split(&words, keys, " \t,");
        for (i = 0; i < words.count; i++) {
            if (lmtp_sieve_ext_ok(words.data[i]))
                strarray_append(&ls->allowed, words.data[i]);
            else
                log_warning("lmtp: sieve extension not available "
                            "key=<sieve_extensions> name=<%s>",
                            words.data[i]);
        }
        strarray_fini(&words);
    } else {
        for (i = 0; all[i]; i++)
            if (lmtp_sieve_ext_ok(all[i]))
                strarray_append(&ls->allowed, all[i]);
    }
    strarray_append(&ls->allowed, "comparator-i;octet");
    strarray_append(&ls->allowed, "comparator-i;ascii-casemap");
    ls->extmask = sieve_bc_extmask(&ls->allowed);
    ls->smtp_host = imapconf_getenum(conf, "smtp_backend") == 1;
    ls->timeout = imapconf_getint(conf, "lmtp_timeout");
    if (ls->timeout <= 0)
        ls->timeout = 300;
    *ls_r = ls;
    return 0;
}

static uint32_t lmtp_sieve_bucket(dev_t dev, ino_t ino)
{
    uint64_t h = ((uint64_t)ino * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)dev;

    return (uint32_t)((h ^ (h >> 29)) % LMTP_SIEVE_BUCKETS);
}

/* The chain of the compiled texts whose text has this hash. */
static struct lmtp_sieve_compiled **lmtp_sieve_comp_chain(
    struct lmtp_sieve *ls, uint64_t hash)
{
    return &ls->comps[hash % LMTP_SIEVE_COMP_BUCKETS];
}

/* A compiled text no entry holds any more. */
static void lmtp_sieve_comp_free(struct lmtp_sieve *ls,
                                 struct lmtp_sieve_compiled *k)
{
    if (k->prev)
        k->prev->next = k->next;
    else
        *lmtp_sieve_comp_chain(ls, k->hash) = k->next;
    if (k->next)
        k->next->prev = k->prev;
    ls->ncomps--;
    sieve_script_free(&k->script);
    free(k->error);
    free(k->text);
    free(k->bc);
    free(k);
}

/* Forget entry c (it leaves its bucket; its compiled text goes with its
 * last entry). */
static void lmtp_sieve_cache_drop(struct lmtp_sieve *ls,
                                  struct lmtp_sieve_cached *c)
{
    struct lmtp_sieve_compiled *k = c->comp;
    uint32_t self = (uint32_t)(c - ls->cache) + 1, *link;

    if (!c->valid)
        return;
    if (ls->probation == self)
        ls->probation = 0;
    for (link = &ls->buckets[lmtp_sieve_bucket(c->dev, c->ino)]; *link;
         link = &ls->cache[*link - 1].chain)
        if (*link == self) {
            *link = c->chain;
            break;
        }
    if (k && --k->refs == 0)
        lmtp_sieve_comp_free(ls, k);
    free(c->name);
    memset(c, 0, sizeof(*c));
}

/* A compiled text used again: kept from now on (see Admission). */
static void lmtp_sieve_admit(struct lmtp_sieve *ls,
                             struct lmtp_sieve_compiled *k)
{
    if (k && k->probation) {
        k->probation = 0;
        ls->probation = 0;
    }
}

/* 1 when a text of this hash was made before (see Admission); records
 * it either way. */
static int lmtp_sieve_ghost(struct lmtp_sieve *ls, uint64_t hash)
{
    uint64_t *g = &ls->ghosts[(hash ^ (hash >> 32)) % LMTP_SIEVE_GHOSTS];
    int seen = *g == hash && hash != 0;

    *g = hash;
    return seen;
}

/* The entry of the file that sb describes, or NULL. */
static struct lmtp_sieve_cached *lmtp_sieve_cache_find(struct lmtp_sieve *ls,
                                                       const struct stat *sb)
{
    uint32_t i = ls->buckets[lmtp_sieve_bucket(sb->st_dev, sb->st_ino)];
    struct lmtp_sieve_cached *c;

    for (; i; i = c->chain) {
        c = &ls->cache[i - 1];
        if (c->dev != sb->st_dev || c->ino != sb->st_ino)
            continue;
        if (c->size == sb->st_size &&
            c->mtime.tv_sec == sb->st_mtim.tv_sec &&
            c->mtime.tv_nsec == sb->st_mtim.tv_nsec &&
            c->ctime.tv_sec == sb->st_ctim.tv_sec &&
            c->ctime.tv_nsec == sb->st_ctim.tv_nsec) {
            c->used = ++ls->tick;
            c->ref = 1;
            lmtp_sieve_admit(ls, c->comp);
            return c;
        }
        lmtp_sieve_cache_drop(ls, c);   /* the file changed */
        return NULL;
    }
    return NULL;
}

/* The clock: the hand passes over entries used since it last came by
 * (clearing their mark) and over those of the execution in progress,
 * and drops the first other one and returns it; with take_free, an
 * unused entry is taken as it is.  NULL after two whole turns without
 * one (every entry in use by the execution, or none to drop). */
static struct lmtp_sieve_cached *lmtp_sieve_clock(struct lmtp_sieve *ls,
                                                  int take_free)
{
    size_t n;

    for (n = 0; n < 2 * LMTP_SIEVE_FILES; n++) {
        struct lmtp_sieve_cached *c = &ls->cache[ls->hand];

        ls->hand = (ls->hand + 1) % LMTP_SIEVE_FILES;
        if (!c->valid) {
            if (take_free)
                return c;
            continue;
        }
        if (c->used > ls->run_tick)
            continue;   /* a script of the running execution */
        if (c->ref) {
            c->ref = 0;
            continue;
        }
        lmtp_sieve_cache_drop(ls, c);
        return c;
    }
    return NULL;
}

void lmtp_sieve_free(struct lmtp_sieve **lsp)
{
    struct lmtp_sieve *ls = *lsp;
    size_t i;

    if (!ls)
        return;
    for (i = 0; i < LMTP_SIEVE_FILES; i++)
        lmtp_sieve_cache_drop(ls, &ls->cache[i]);
    free(ls->cache);
    free(ls->buckets);
    free(ls->ghosts);
    lmtp_smtp_free(&ls->smtp);
    strarray_fini(&ls->allowed);
    free(ls);
    *lsp = NULL;
}

unsigned long lmtp_sieve_compiles(const struct lmtp_sieve *ls)
{
    return ls->compiles;
}

unsigned long lmtp_sieve_bcloads(const struct lmtp_sieve *ls)
{
    return ls->bcloads;
}

/* ---- the compiled-script cache ------------------------------------------ */

/* Read the whole open file fd into text (at most max + 1 bytes); size is
 * what fstat() said: one read of size + 1 bytes that comes back short is
 * the whole file (a regular file's short read is its end).  0, or -1
 * (errno set). */
static int lmtp_sieve_read(int fd, size_t size, size_t max, struct buf *text)
{
    size_t want = (size < max ? size : max) + 1;
    ssize_t n;

    for (;;) {
        if (buf_ensure(text, want) != 0) {
            errno = ENOMEM;
            return -1;
        }
        n = read(fd, text->s + text->len, want);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        text->len += (size_t)n;
        if (text->len > max || (size_t)n < want)
            return 0;
        want = 8192;   /* it grew since the fstat: read on */
    }
}

/* the largest NAME.bc read: a form's payload is a few times its text */
#define LMTP_SIEVE_BC_MAX(ls) (4 * (ls)->limits.max_script_size + 65536)

/* The stored compiled form DIR/NAME.bc of the text: 1 loaded into
 * *script_r, its bytes left in *bc (the caller frees them) and
 * *current_r 1 when it names the file of sb as its source; 0 not
 * (missing: *why_r NULL; stale or damaged: *why_r the reason). */
static int lmtp_sieve_load_bc(struct lmtp_sieve *ls, const char *dir,
                              const char *name, const struct buf *text,
                              uint64_t hash, const struct stat *sb,
                              struct buf *bc, int *current_r,
                              struct sieve_script **script_r,
                              const char **why_r)
{
    int r;

    *why_r = NULL;
    *current_r = 0;
    r = sievedir_get_bc(dir, name, LMTP_SIEVE_BC_MAX(ls), bc);
    if (r == SIEVEDIR_NOTFOUND)
        return 0;
    if (r != SIEVEDIR_OK) {
        *why_r = "unreadable";
        return 0;
    }
    r = sieve_bc_decode_known(bc->s, bc->len, text->len, hash, ls->extmask,
                              &ls->limits, script_r, why_r);
    if (r != SIEVE_OK)
        return 0;
    *current_r = sievedir_bc_is_source(bc->s, bc->len, sb);
    return 1;
}

/* What two stored forms of the same tree have in common: the header
 * from the text's size to the payload's size (the version and magic
 * are checked by every load, the checksum and the source differ per
 * file), then the payload. */
#define LMTP_SIEVE_BC_SAME 16
#define LMTP_SIEVE_BC_SAME_END 60

/* the bytes of the stored form bc that k keeps for comparison */
static void lmtp_sieve_keep_bc(struct lmtp_sieve_compiled *k,
                               const struct buf *bc)
{
    size_t h = LMTP_SIEVE_BC_SAME_END - LMTP_SIEVE_BC_SAME;
    size_t n = bc->len - SIEVE_BC_HEADER;

    k->bc = malloc(h + n);
    if (k->bc) {
        memcpy(k->bc, bc->s + LMTP_SIEVE_BC_SAME, h);
        memcpy(k->bc + h, bc->s + SIEVE_BC_HEADER, n);
        k->bclen = h + n;
    }
}

/* 1 when k was loaded from a stored form with the same tree as bc */
static int lmtp_sieve_same_bc(const struct lmtp_sieve_compiled *k,
                              const struct buf *bc)
{
    size_t h = LMTP_SIEVE_BC_SAME_END - LMTP_SIEVE_BC_SAME;

    return k->bc && k->bclen == h + bc->len - SIEVE_BC_HEADER &&
           memcmp(k->bc, bc->s + LMTP_SIEVE_BC_SAME, h) == 0 &&
           memcmp(k->bc + h, bc->s + SIEVE_BC_HEADER, k->bclen - h) == 0;
}

/* Write the compiled form DIR/NAME.bc after a compile (a cache: not
 * synced); a failure is logged once per process. */
static void lmtp_sieve_store_bc(struct lmtp_sieve *ls, const char *dir,
                                const char *name,
                                const struct sieve_script *script,
                                const struct buf *text,
                                const struct stat *src)
{
    int r = sievedir_store_bc(dir, name, script, text->s, text->len,
                              &ls->allowed, src, 0);

    if (r == SIEVEDIR_OK || ls->bc_quiet)
        return;
    ls->bc_quiet = 1;
    log_warning("lmtp: sieve cannot write compiled form dir=<%s> name=<%s> "
                "error=<%s: %s> (not logged again by this process)", dir,
                name, sievedir_strerror(r), strerror(errno));
}

/* The compiled script behind the open file fd (path for logs): the cache
 * entry of the file (device, inode, size, mtime, ctime), else the
 * compiled form of another entry whose file holds the same bytes, else
 * the stored compiled form bcdir/bcname.bc (bcdir NULL: none) when it is
 * current for the text, else a compilation (which writes bcname.bc).
 * With fd -1 the file is not opened: known is its stat(), and only a
 * stored form that names that file as its source (the same inode, mtime
 * and size: sievedir_bc_is_source()) is taken, compared with the held
 * compiled texts by its payload; NULL with errno ESTALE when there is
 * none (the caller opens the file).  A new entry remembers name (the
 * active link's target; NULL: none).  Returns the entry, whose compiled
 * text has script NULL and error set when it did not compile, or NULL on
 * an I/O or memory failure. */
static struct lmtp_sieve_cached *
lmtp_sieve_load(struct lmtp_sieve *ls, int fd, const struct stat *known,
                const char *path, const char *bcdir, const char *bcname,
                const char *name)
{
    struct lmtp_sieve_cached *c, *victim;
    struct lmtp_sieve_compiled *k = NULL, *o;
    struct sieve_script *loaded = NULL;
    struct stat sb;
    struct buf text = BUF_INITIALIZER, err = BUF_INITIALIZER;
    struct buf bc = BUF_INITIALIZER;
    uint64_t hash, textlen = 0;
    int r, current = 0;

    if (fd >= 0) {
        if (fstat(fd, &sb) != 0)
            return NULL;
    } else if (known && bcdir) {
        sb = *known;
    } else {
        errno = EINVAL;
        return NULL;
    }
    if ((c = lmtp_sieve_cache_find(ls, &sb)))
        return c;
    if (fd < 0) {
        /* the stored form alone, when it names this file as its source */
        uint64_t ino;
        int64_t mt;

        if (sievedir_get_bc(bcdir, bcname, LMTP_SIEVE_BC_MAX(ls), &bc) !=
                SIEVEDIR_OK ||
            !sievedir_bc_is_source(bc.s, bc.len, &sb) ||
            sieve_bc_source(bc.s, bc.len, &textlen, &hash, &ino, &mt) != 0) {
            buf_free(&bc);
            errno = ESTALE;
            return NULL;
        }
        for (o = *lmtp_sieve_comp_chain(ls, hash); o && !k; o = o->next)
            if (o->hash == hash && lmtp_sieve_same_bc(o, &bc))
                k = o;
        if (!k) {
            const char *why = NULL;

            /* decoded before the probation slot's text leaves: a form
             * that does not load leaves everything as it was */
            if (sieve_bc_decode_known(bc.s, bc.len, (size_t)textlen, hash,
                                      ls->extmask, &ls->limits, &loaded,
                                      &why) != SIEVE_OK) {
                buf_free(&bc);
                errno = ESTALE;
                return NULL;
            }
        }
        r = SIEVE_OK;
    } else if ((size_t)sb.st_size > ls->limits.max_script_size + 1) {
        /* do not read more than the limit allows */
        r = SIEVE_ELIMIT;
        buf_printf(&err, "script of %lld bytes over sieve_maxscriptsize",
                   (long long)sb.st_size);
        hash = sieve_bc_hash("", 0);
    } else {
        if (lmtp_sieve_read(fd, (size_t)sb.st_size,
                            ls->limits.max_script_size, &text) != 0) {
            buf_free(&text);
            return NULL;
        }
        r = SIEVE_OK;
        hash = sieve_bc_hash(text.s ? text.s : "", text.len);
        for (o = *lmtp_sieve_comp_chain(ls, hash); o && !k; o = o->next)
            if (o->text && o->hash == hash && o->len == text.len &&
                memcmp(o->text, text.s ? text.s : "", text.len) == 0)
                k = o;
    }
    lmtp_sieve_admit(ls, k);
    if (!k) {
        const char *why = NULL;
        /* an active script's text not made before goes on probation,
         * and the one there leaves (unless the running execution holds
         * it: it is then kept) before this tree takes its memory */
        int probation = name && !lmtp_sieve_ghost(ls, hash);

        if (probation && ls->probation) {
            struct lmtp_sieve_cached *p = &ls->cache[ls->probation - 1];

            if (p->used > ls->run_tick)
                lmtp_sieve_admit(ls, p->comp);
            else
                lmtp_sieve_cache_drop(ls, p);
        }
        /* room for one more compiled text: entries go until fewer than
         * LMTP_SIEVE_CACHE are held (or none can go: the bound is then
         * passed while the execution holds them) */
        while (ls->ncomps >= LMTP_SIEVE_CACHE && lmtp_sieve_clock(ls, 0))
            ;
        k = calloc(1, sizeof(*k));
        if (!k) {
            sieve_script_free(&loaded);
            buf_free(&text);
            buf_free(&err);
            buf_free(&bc);
            return NULL;
        }
        if (loaded) {
            k->script = loaded;
            lmtp_sieve_keep_bc(k, &bc);
            ls->bcloads++;   /* the recipient's line says how many */
        } else if (r == SIEVE_OK && bcdir &&
                   lmtp_sieve_load_bc(ls, bcdir, bcname, &text, hash, &sb,
                                      &bc, &current, &k->script, &why)) {
            lmtp_sieve_keep_bc(k, &bc);
            ls->bcloads++;
            /* current for the text, but not naming this file: stored
             * again (a cache, not synced), so that the next load need
             * not read the text */
            if (!current)
                lmtp_sieve_store_bc(ls, bcdir, bcname, k->script, &text,
                                    &sb);
        } else {
            if (why && !ls->bc_quiet)
                log_warning("lmtp: sieve ignoring compiled form script=<%s> "
                            "reason=<%s>; compiling the text", path, why);
            if (r == SIEVE_OK)
                r = sieve_compile(text.s ? text.s : "", text.len,
                                  &ls->limits, &ls->allowed, &k->script,
                                  &err);
            if (r == SIEVE_ENOMEM) {
                free(k);
                buf_free(&text);
                buf_free(&err);
                buf_free(&bc);
                return NULL;
            }
            ls->compiles++;
            if (r == SIEVE_OK && bcdir)
                lmtp_sieve_store_bc(ls, bcdir, bcname, k->script, &text,
                                    &sb);
            if (r != SIEVE_OK)
                k->error = strdup(err.len ? buf_cstring(&err)
                                          : sieve_strerror(r));
            log_info("lmtp: sieve compiled script=<%s> result=<%s>%s%s%s "
                     "compiles=<%lu>", path, r == SIEVE_OK ? "ok" : "error",
                     k->error ? " error=<" : "", k->error ? k->error : "",
                     k->error ? ">" : "", ls->compiles);
        }
        k->hash = hash;
        k->probation = probation;
        if (r == SIEVE_OK && text.len) {
            k->len = text.len;
            k->text = buf_release(&text);
        }
        {
            struct lmtp_sieve_compiled **head =
                lmtp_sieve_comp_chain(ls, hash);

            k->next = *head;
            if (*head)
                (*head)->prev = k;
            *head = k;
        }
        ls->ncomps++;
    }
    buf_free(&bc);
    k->refs++;   /* before the victim's drop, which may free a text */
    victim = lmtp_sieve_clock(ls, 1);
    if (!victim) {
        /* every entry belongs to the running execution */
        if (--k->refs == 0)
            lmtp_sieve_comp_free(ls, k);
        errno = ENOMEM;
        buf_free(&text);
        buf_free(&err);
        return NULL;
    }
    victim->comp = k;
    victim->dev = sb.st_dev;
    victim->ino = sb.st_ino;
    victim->size = sb.st_size;
    victim->mtime = sb.st_mtim;
    victim->ctime = sb.st_ctim;
    victim->name = name ? strdup(name) : NULL;
    victim->used = ++ls->tick;
    victim->ref = 1;
    victim->valid = 1;
    if (k->probation)
        ls->probation = (uint32_t)(victim - ls->cache) + 1;
    {
        uint32_t *head = &ls->buckets[lmtp_sieve_bucket(sb.st_dev,
                                                        sb.st_ino)];

        victim->chain = *head;
        *head = (uint32_t)(victim - ls->cache) + 1;
    }
    buf_free(&text);
    buf_free(&err);
    return victim;
}

/* ---- the message as the script sees it ---------------------------------- */

struct lmtp_sieve_run {
    struct sieve_msg sm;          /* first: sieve_msg's callbacks' rock */
    struct lmtp_sieve *ls;
    struct lmtp_sieve_msg *m;
    const char *userid;
    const char *inbox;
    const char *keep;             /* the keep target RCPT resolved */
    const char *rcpt;
};

static int lmtp_sieve_map(struct lmtp_sieve_msg *m)
{
    void *map;
    const char *path;
    struct stat sb;
    int fd;

    if (m->map)
        return 0;
    m->map = append_stage_bytes(m->st, &m->maplen);
    if (m->map) {
        m->mapped = 0;   /* the stage's buffer: no file read */
        return 0;
    }
    path = append_stage_path(m->st);
    if (!path)
        return -1;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    if (fstat(fd, &sb) != 0) {
        close(fd);
        return -1;
    }
    if (sb.st_size == 0) {
        close(fd);
        m->map = "";
        m->maplen = 0;
        m->mapped = 0;
        return 0;
    }
    map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (map == MAP_FAILED)
        return -1;
    m->map = map;
    m->maplen = (size_t)sb.st_size;
    m->mapped = 1;
    return 0;
}

void lmtp_sieve_msg_fini(struct lmtp_sieve_msg *m)
{
    if (m->map && m->maplen && m->mapped)
        munmap((void *)m->map, m->maplen);
    m->map = NULL;
    m->maplen = 0;
}

/* A mailbox name written in a script, for this user, into internal form:
 * "INBOX", "INBOX.sub" ("INBOX/sub" with unixhierarchysep) are the
 * user's; anything else is a name of the user's namespace as IMAP
 * writes it.  0 or -1. */
static int lmtp_sieve_mboxname(struct lmtp_sieve_run *run, const char *name,
                               struct buf *out)
{
    int unixsep = imapconf_getswitch(run->ls->conf, "unixhierarchysep");
    char sep = unixsep ? '/' : '.';
    const char *dom = strchr(run->userid, '@');
    struct buf sub = BUF_INITIALIZER;
    int r = -1;

    buf_reset(out);
    if (strncasecmp(name, "INBOX", 5) == 0 &&
        (name[5] == '\0' || name[5] == sep)) {
        if (name[5] == '\0')
            return buf_setcstr(out, run->inbox) == 0 ? 0 : -1;
        if (mboxname_to_internal(name + 6, unixsep, &sub, NULL) == STORE_OK &&
            buf_printf(out, "%s.%s", run->inbox, buf_cstring(&sub)) == 0 &&
            mboxname_check(buf_cstring(out), NULL) == STORE_OK)
            r = 0;
        buf_free(&sub);
        if (r)
            buf_reset(out);
        return r;
    }
    if (mboxname_to_internal_for(name, unixsep, dom ? dom + 1 : NULL, 0, out,
                                 NULL) != STORE_OK)
        return -1;
    buf_cstring(out);
    return 0;
}

/* 1 exists and the user may post there, 0 no, -1 database trouble. */
static int lmtp_sieve_postable(struct lmtp_sieve_run *run, const char *name)
{
    struct mboxlist_entry *e = NULL;
    int r;

    /* the keep target: found and allowed when the recipient was resolved
     * (RCPT), moments ago; the commit finds it again */
    if (run->keep && strcmp(name, run->keep) == 0)
        return 1;
    r = mboxlist_lookup(deliver_mboxlist(run->ls->dctx), name, &e);
    if (r == STORE_NOTFOUND || r == STORE_BADNAME)
        return 0;
    if (r != STORE_OK)
        return -1;
    r = mboxname_is_self_or_child(run->inbox, name) ||
        (acl_rights(e->acl, run->userid, NULL) & ACL_POST) != 0;
    mboxlist_entry_free(&e);
    return r;
}

/* special-use (RFC 8579): the first of the user's mailboxes (INBOX and
 * below, in mailbox order) whose special-use list (RFC 6154, kept in
 * its mailbox list entry) names `use`, case-insensitively. */
struct lmtp_sieve_su {
    const char *use;
    struct buf *out;
};

static int lmtp_sieve_su_cb(void *rock, const struct mboxlist_entry *e)
{
    struct lmtp_sieve_su *su = rock;
    const char *p = e->specialuse;
    size_t n = strlen(su->use);

    while (p && *p) {
        const char *end = strchr(p, ' ');
        size_t len = end ? (size_t)(end - p) : strlen(p);

        if (len == n && strncasecmp(p, su->use, n) == 0)
            return buf_setcstr(su->out, e->name) == 0 ? 1 : -1;
        p = end ? end + 1 : NULL;
    }
    return 0;
}

/* The canonical spelling of an RFC 6154 attribute (as imapd stores the
 * attributes of CREATE (USE ...)), or NULL for one not known: a mailbox
 * created by :create :specialuse then gets no attribute. */
static const char *lmtp_sieve_specialuse_canon(const char *use)
{
    static const char *const known[] = {
        "\\All", "\\Archive", "\\Drafts", "\\Flagged", "\\Junk",
        "\\Sent", "\\Trash", NULL
    };
    size_t i;

    for (i = 0; known[i]; i++)
        if (strcasecmp(use, known[i]) == 0)
            return known[i];
    return NULL;
}

/* 1 found with its name in out, 0 none the user may post to, -1
 * database trouble. */
static int lmtp_sieve_specialuse(struct lmtp_sieve_run *run, const char *use,
                                 struct buf *out)
{
    struct lmtp_sieve_su su = { use, out };
    struct buf pat = BUF_INITIALIZER;
    struct mboxlist_entry *e = NULL;
    int r;

    buf_reset(out);
    if (!use || use[0] != '\\' || mboxlist_specialuse_check(use) < 0 ||
        strchr(use, ' '))
        return 0;
    r = mboxlist_lookup(deliver_mboxlist(run->ls->dctx), run->inbox, &e);
    if (r == STORE_OK) {
        r = lmtp_sieve_su_cb(&su, e);
        mboxlist_entry_free(&e);
        if (r != 0)
            return r;
    } else if (r != STORE_NOTFOUND) {
        return -1;
    }
    if (buf_printf(&pat, "%s.*", run->inbox) < 0)
        return -1;
    r = mboxlist_list(deliver_mboxlist(run->ls->dctx), buf_cstring(&pat),
                      lmtp_sieve_su_cb, &su);
    buf_free(&pat);
    if (r == 1) {
        r = lmtp_sieve_postable(run, buf_cstring(out));
        if (r == 0)
            buf_reset(out);
        return r;
    }
    return r == STORE_OK ? 0 : -1;
}

static int lmtp_sieve_cb_mailbox_exists(void *rock, const char *mailbox)
{
    struct lmtp_sieve_run *run = rock;
    struct buf name = BUF_INITIALIZER;
    int r = 0;

    if (lmtp_sieve_mboxname(run, mailbox, &name) == 0)
        r = lmtp_sieve_postable(run, buf_cstring(&name));
    buf_free(&name);
    return r;
}

/* Is the deliver.db memory (id, who) still alive?  1, 0, -1. */
static int lmtp_sieve_remembered(struct lmtp_sieve *ls, const char *id,
                                 const char *who)
{
    struct duplicate_db *d;
    time_t until;
    int r;

    if (strlen(id) > LMTP_SIEVE_KEY_MAX)
        return 0;
    if (deliver_duplicate_db(ls->dctx, &d) != STORE_OK)
        return -1;
    r = duplicate_check(d, id, strlen(id), who, &until, NULL);
    if (r == STORE_NOTFOUND)
        return 0;
    if (r != STORE_OK)
        return -1;
    return until > time(NULL);
}

static int lmtp_sieve_remember(struct lmtp_sieve *ls, const char *id,
                               const char *who, unsigned long seconds)
{
    struct duplicate_db *d;

    if (strlen(id) > LMTP_SIEVE_KEY_MAX)
        return 0;
    if (deliver_duplicate_db(ls->dctx, &d) != STORE_OK)
        return -1;
    return duplicate_mark(d, id, strlen(id), who,
                          time(NULL) + (time_t)seconds, 0) == STORE_OK
               ? 0 : -1;
}

static int lmtp_sieve_cb_duplicate(void *rock, const char *id)
{
    struct lmtp_sieve_run *run = rock;
    struct buf key = BUF_INITIALIZER;
    int r;

    buf_printf(&key, "sieve-duplicate:%s", id);
    r = lmtp_sieve_remembered(run->ls, buf_cstring(&key), run->userid);
    buf_free(&key);
    return r;
}

static int lmtp_sieve_cb_environment(void *rock, const char *name,
                                     struct buf *value)
{
    struct lmtp_sieve_run *run = rock;
    const char *host = run->m->servername, *dot;

    if (strcmp(name, "host") == 0)
        return buf_setcstr(value, host) == 0 ? 1 : -1;
    if (strcmp(name, "domain") == 0) {
        dot = strchr(host, '.');
        return buf_setcstr(value, dot ? dot + 1 : host) == 0 ? 1 : -1;
    }
    if (strcmp(name, "name") == 0)
        return buf_setcstr(value, "cyrusdeliver") == 0 ? 1 : -1;
    if (strcmp(name, "version") == 0)
        return buf_setcstr(value, PACKAGE_VERSION) == 0 ? 1 : -1;
    if (strcmp(name, "phase") == 0)
        return buf_setcstr(value, "during") == 0 ? 1 : -1;
    if (strcmp(name, "location") == 0)
        return buf_setcstr(value, "MDA") == 0 ? 1 : -1;
    return 0;
}

/* include (RFC 6609): NAME.script of the user's directory (:personal) or
 * of the global directory (:global), compiled through the same cache as
 * the active script.  Each execution looks at the files again (fstat),
 * so a changed included script is compiled again even when the script
 * including it did not change.  The library finds loops: an include of
 * a script already executing gives the cache entry, hence the compiled
 * script, it is running. */
static int lmtp_sieve_cb_include(void *rock, int global, const char *name,
                                 const struct sieve_script **script_r,
                                 struct buf *errmsg)
{
    struct lmtp_sieve_run *run = rock;
    const struct lmtp_sieve_compiled *c;
    struct lmtp_sieve_cached *e;
    struct buf dir = BUF_INITIALIZER, path = BUF_INITIALIZER;
    struct stat sb;
    int fd, r = 0;

    *script_r = NULL;
    if (!sievedir_name_valid(name, strlen(name))) {
        buf_printf(errmsg, "invalid script name");
        return 0;
    }
    if ((global ? sievedir_global_path(run->ls->conf, &dir)
                : sievedir_user_path(run->ls->conf, run->userid, &dir)) !=
            SIEVEDIR_OK ||
        sievedir_script_path(buf_cstring(&dir), name, &path) != SIEVEDIR_OK) {
        r = -1;
        goto out;
    }
    /* a file unchanged since its entry was made is not opened */
    e = stat(buf_cstring(&path), &sb) == 0
            ? lmtp_sieve_cache_find(run->ls, &sb) : NULL;
    if (!e) {
        fd = open(buf_cstring(&path), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
        if (fd < 0) {
            if (errno != ENOENT && errno != ENOTDIR) {
                log_warning("lmtp: sieve included script unreadable "
                            "script=<%s> error=<%s>", buf_cstring(&path),
                            strerror(errno));
                buf_printf(errmsg, "script unreadable");
            }
            goto out;   /* not found: :optional decides */
        }
        e = lmtp_sieve_load(run->ls, fd, NULL, buf_cstring(&path),
                            buf_cstring(&dir), name, NULL);
        close(fd);
    }
    c = e ? e->comp : NULL;
    if (!c) {
        log_error("lmtp: sieve included script unreadable script=<%s> "
                  "error=<%s>", buf_cstring(&path), strerror(errno));
        r = -1;
        goto out;
    }
    if (!c->script) {
        buf_printf(errmsg, "does not compile: %s", c->error ? c->error : "");
        goto out;
    }
    *script_r = c->script;
    r = 1;
out:
    buf_free(&dir);
    buf_free(&path);
    return r;
}

/* ---- sendmail ----------------------------------------------------------- */

/* Milliseconds left until deadline (monotonic, ms), at least 0. */
static long lmtp_sieve_left(uint64_t deadline)
{
    struct timespec ts;
    uint64_t now;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    now = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    return now >= deadline ? 0 : (long)(deadline - now);
}

/* Write all of (p, len) to the non-blocking fd before the deadline.
 * 0, or -1 (an error, or the deadline passed: *late_r = 1). */
static int lmtp_sieve_write(int fd, const char *p, size_t len,
                            uint64_t deadline, int *late_r)
{
    while (len > 0) {
        ssize_t n = write(fd, p, len);
        struct pollfd pfd;
        long left;

        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)
            return -1;
        left = lmtp_sieve_left(deadline);
        if (left == 0) {
            *late_r = 1;
            return -1;
        }
        pfd.fd = fd;
        pfd.events = POLLOUT;
        pfd.revents = 0;
        if (poll(&pfd, 1, (int)(left > 1000 ? 1000 : left)) < 0 &&
            errno != EINTR)
            return -1;
    }
    return 0;
}

/* Hand the message head then body from FROM to TO to the MTA, within
 * lmtp_timeout seconds: with smtp_backend: host over SMTP to smtp_host
 * (lmtp_smtp.h), else by running `sendmail -i -f FROM -- TO` with the
 * message on its standard input (killed with its process group when
 * late).  0 when the MTA has it (250 to the end of data; sendmail's exit
 * status 0), else -1 (logged). */
static int lmtp_sieve_sendmail(struct lmtp_sieve *ls, const char *from,
                               const char *to, const char *head,
                               size_t headlen, const char *body,
                               size_t bodylen)
{
    const char *prog;
    long timeout = ls->timeout;
    struct strarray words = STRARRAY_INITIALIZER;
    int pfd[2], status = -1, ok = 1, late = 0, pidfd;
    uint64_t deadline;
    pid_t pid;

    if (ls->smtp_host) {
        if (!ls->smtp && !(ls->smtp = lmtp_smtp_new(ls->conf))) {
            log_error("lmtp: sieve smtp failed to=<%s> error=<%s>", to,
                      strerror(ENOMEM));
            return -1;
        }
        return lmtp_smtp_send(ls->smtp, from, to, head, headlen, body,
                              bodylen, timeout);
    }
    prog = imapconf_getstring(ls->conf, "sendmail");
    deadline = 0;
    {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        deadline = (uint64_t)ts.tv_sec * 1000 +
                   (uint64_t)ts.tv_nsec / 1000000 + (uint64_t)timeout * 1000;
    }
    strarray_split(&words, prog ? prog : "", " \t");
    if (words.count == 0 || words.count > LMTP_SIEVE_SENDMAIL_ARGS) {
        log_error("lmtp: sieve sendmail key unusable key=<sendmail> "
                  "words=<%zu>", words.count);
        strarray_fini(&words);
        return -1;
    }
    /* the pipe's ends are close-on-exec: the child gets only its copy
     * of the read end, as its standard input */
    if (pipe2(pfd, O_CLOEXEC) != 0) {
        log_error("lmtp: sieve cannot run sendmail error=<%s>",
                  strerror(errno));
        strarray_fini(&words);
        return -1;
    }
    {
        /* posix_spawn (clone with CLONE_VM | CLONE_VFORK in glibc): no
         * copy of this process's page tables, as fork made, for a child
         * that only sets up its descriptors and execs */
        char *argv[LMTP_SIEVE_SENDMAIL_ARGS + 8];
        size_t na = 0, k;
        posix_spawn_file_actions_t fa;
        posix_spawnattr_t attr;
        sigset_t none, dfl;
        int e;

        /* the key: a path and maybe arguments ("/usr/sbin/sendmail -C
         * /etc/postfix-out"), split at spaces */
        for (k = 0; k < words.count && k < LMTP_SIEVE_SENDMAIL_ARGS; k++)
            argv[na++] = words.data[k];
        argv[na++] = "-i";
        argv[na++] = "-f";
        argv[na++] = (char *)from;
        argv[na++] = "--";
        argv[na++] = (char *)to;
        argv[na] = NULL;
        sigemptyset(&none);
        sigemptyset(&dfl);
        sigaddset(&dfl, SIGPIPE);
        e = posix_spawn_file_actions_init(&fa);
        if (e == 0 && (e = posix_spawnattr_init(&attr)) != 0)
            posix_spawn_file_actions_destroy(&fa);
        if (e == 0) {
            /* stdin: the pipe; stdout: /dev/null; no listening socket or
             * client connection goes with it (every other descriptor
             * closed); its own process group (killed as one on a
             * timeout), SIGPIPE at its default, no signal blocked */
            if ((e = posix_spawn_file_actions_adddup2(&fa, pfd[0], 0)) ||
                (e = posix_spawn_file_actions_addopen(&fa, 1, "/dev/null",
                                                      O_WRONLY, 0)) ||
                (e = posix_spawn_file_actions_addclosefrom_np(&fa, 3)) ||
                (e = posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP |
                                              POSIX_SPAWN_SETSIGDEF |
                                              POSIX_SPAWN_SETSIGMASK)) ||
                (e = posix_spawnattr_setpgroup(&attr, 0)) ||
                (e = posix_spawnattr_setsigdefault(&attr, &dfl)) ||
                (e = posix_spawnattr_setsigmask(&attr, &none)) == 0)
                e = posix_spawn(&pid, argv[0], &fa, &attr, argv, environ);
            posix_spawn_file_actions_destroy(&fa);
            posix_spawnattr_destroy(&attr);
        }
        if (e != 0) {
            log_error("lmtp: sieve cannot run sendmail program=<%s> "
                      "error=<%s>", argv[0], strerror(e));
            close(pfd[0]);
            close(pfd[1]);
            strarray_fini(&words);
            return -1;
        }
    }
    strarray_fini(&words);
    close(pfd[0]);
    if (fcntl(pfd[1], F_SETFL, O_NONBLOCK) != 0 ||
        (headlen && lmtp_sieve_write(pfd[1], head, headlen, deadline,
                                     &late) != 0) ||
        (bodylen && lmtp_sieve_write(pfd[1], body, bodylen, deadline,
                                     &late) != 0))
        ok = 0;
    close(pfd[1]);
    /* wait for its exit: a pidfd becomes readable at once when it exits
     * (no sleeping in steps, which cost each reply up to a step); where
     * pidfds are missing, steps of 1 ms */
#ifdef SYS_pidfd_open
    pidfd = late ? -1 : (int)syscall(SYS_pidfd_open, pid, 0);
#else
    pidfd = -1;
#endif
    for (;;) {
        pid_t w = late ? 0 : waitpid(pid, &status, WNOHANG);
        long left;

        if (w == pid)
            break;
        if (w < 0 && errno != EINTR) {
            status = -1;
            break;
        }
        left = late ? 0 : lmtp_sieve_left(deadline);
        if (left == 0) {
            late = 1;
            kill(-pid, SIGKILL);
            kill(pid, SIGKILL);
            while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
                ;
            status = -1;
            break;
        }
        if (pidfd >= 0) {
            struct pollfd wfd = { .fd = pidfd, .events = POLLIN };

            (void)poll(&wfd, 1, (int)(left > 1000 ? 1000 : left));
        } else {
            struct timespec nap = { 0, 1000000L };

            nanosleep(&nap, NULL);
        }
    }
    if (pidfd >= 0)
        close(pidfd);
    if (!ok || status == -1 || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
        log_error("lmtp: sieve sendmail failed program=<%s> to=<%s> "
                  "status=<%d>%s", prog, to,
                  status != -1 && WIFEXITED(status) ? WEXITSTATUS(status)
                                                    : -1,
                  late ? " reason=<timeout>" : "");
        return -1;
    }
    return 0;
}

/* ---- header helpers ---------------------------------------------------- */

static const char *lmtp_sieve_header1(struct lmtp_sieve_run *run,
                                      struct sieve_message_ctx *ctx,
                                      const char *name, struct strarray *v)
{
    strarray_fini(v);
    if (ctx->header(&run->sm, name, 1, v) != 0 || v->count == 0)
        return NULL;
    return v->data[0];
}

static int lmtp_sieve_has_header(struct lmtp_sieve_run *run,
                                 struct sieve_message_ctx *ctx,
                                 const char *name)
{
    struct strarray v = STRARRAY_INITIALIZER;
    int has = lmtp_sieve_header1(run, ctx, name, &v) != NULL;

    strarray_fini(&v);
    return has;
}

/* The bare address of the recipient "local@domain" (quotes kept). */
static int lmtp_sieve_addr_eq(const char *a, const char *b)
{
    return strcasecmp(a, b) == 0;
}

/* Does a To/Cc/Bcc/Resent-* field mention one of the user's addresses?
 * (RFC 5230 4.5, a case-insensitive substring test on the unfolded
 * field.) */
static int lmtp_sieve_addressed(struct lmtp_sieve_run *run,
                                struct sieve_message_ctx *ctx,
                                const struct strarray *mine)
{
    static const char *const fields[] = {
        "to", "cc", "bcc", "resent-to", "resent-cc", "resent-bcc", NULL
    };
    struct strarray v = STRARRAY_INITIALIZER;
    size_t f, i, j;
    int found = 0;

    for (f = 0; fields[f] && !found; f++) {
        strarray_fini(&v);
        if (ctx->header(&run->sm, fields[f], 1, &v) != 0)
            continue;
        for (i = 0; i < v.count && !found; i++)
            for (j = 0; j < mine->count && !found; j++)
                if (mine->data[j][0] && strcasestr(v.data[i], mine->data[j]))
                    found = 1;
    }
    strarray_fini(&v);
    return found;
}

/* A header value made safe for a header line: no CR/LF, at most max. */
static void lmtp_sieve_safe(struct buf *out, const char *s, size_t max)
{
    size_t i;

    for (i = 0; s[i] && i < max; i++)
        buf_putc(out, (s[i] == '\r' || s[i] == '\n' || s[i] == '\t')
                          ? ' ' : s[i]);
}

/* ---- vacation ---------------------------------------------------------- */

/* 1 sent (or rightly not sent), -1 sendmail failed.  *why_r says what
 * happened, for the log. */
static int lmtp_sieve_vacation(struct lmtp_sieve_run *run,
                               struct sieve_message_ctx *ctx,
                               const struct sieve_action *a,
                               const char **why_r)
{
    struct lmtp_sieve *ls = run->ls;
    const char *sender = run->m->sender;
    struct strarray mine = STRARRAY_INITIALIZER, v = STRARRAY_INITIALIZER;
    struct buf key = BUF_INITIALIZER, h = BUF_INITIALIZER;
    const char *val, *at;
    char date[64];
    time_t now = time(NULL);
    struct tm tm;
    size_t i, llen;
    int r = 1;

    *why_r = "sent";
    strarray_append(&mine, run->rcpt);
    {
        /* also the address without its +detail */
        const char *plus = strchr(run->rcpt, '+');
        at = strrchr(run->rcpt, '@');
        if (plus && (!at || plus < at)) {
            buf_append(&key, run->rcpt, (size_t)(plus - run->rcpt));
            if (at)
                buf_appendcstr(&key, at);
            strarray_append(&mine, buf_cstring(&key));
            buf_reset(&key);
        }
    }
    for (i = 0; i < a->addresses.count; i++)
        strarray_append(&mine, a->addresses.data[i]);

    if (!sender[0]) {
        *why_r = "null sender";
        goto out;
    }
    for (i = 0; i < mine.count; i++)
        if (lmtp_sieve_addr_eq(sender, mine.data[i])) {
            *why_r = "own address";
            goto out;
        }
    at = strrchr(sender, '@');
    llen = at ? (size_t)(at - sender) : strlen(sender);
    if ((llen == 14 && strncasecmp(sender, "MAILER-DAEMON", 13) == 0) ||
        (llen >= 13 && strncasecmp(sender, "MAILER-DAEMON", 13) == 0) ||
        strncasecmp(sender, "owner-", 6) == 0 ||
        (llen >= 8 && strncasecmp(sender + llen - 8, "-request", 8) == 0)) {
        *why_r = "list or daemon sender";
        goto out;
    }
    {
        static const char *const lists[] = {
            "list-id", "list-help", "list-subscribe", "list-unsubscribe",
            "list-post", "list-owner", "list-archive", NULL
        };
        for (i = 0; lists[i]; i++)
            if (lmtp_sieve_has_header(run, ctx, lists[i])) {
                *why_r = "mailing list";
                goto out;
            }
    }
    if ((val = lmtp_sieve_header1(run, ctx, "precedence", &v)) != NULL &&
        (strcasestr(val, "bulk") || strcasestr(val, "junk") ||
         strcasestr(val, "list"))) {
        *why_r = "bulk precedence";
        goto out;
    }
    if ((val = lmtp_sieve_header1(run, ctx, "auto-submitted", &v)) != NULL) {
        while (*val == ' ')
            val++;
        if (strncasecmp(val, "no", 2) != 0 ||
            (val[2] && val[2] != ' ' && val[2] != ';' && val[2] != '(')) {
            *why_r = "auto-submitted";
            goto out;
        }
    }
    if (!lmtp_sieve_addressed(run, ctx, &mine)) {
        *why_r = "not addressed to the user";
        goto out;
    }
    buf_printf(&key, "sieve-vacation:%s:%s", sender,
               a->handle ? a->handle : "");
    r = lmtp_sieve_remembered(ls, buf_cstring(&key), run->userid);
    if (r != 0) {
        *why_r = r > 0 ? "already answered" : "database error";
        r = r > 0 ? 1 : -1;
        goto out;
    }

    /* the reply */
    buf_appendcstr(&h, "From: ");
    lmtp_sieve_safe(&h, a->from ? a->from : run->rcpt, 998);
    buf_appendcstr(&h, "\r\nTo: <");
    lmtp_sieve_safe(&h, sender, 512);
    buf_appendcstr(&h, ">\r\nSubject: ");
    if (a->subject) {
        lmtp_sieve_safe(&h, a->subject, 900);
    } else {
        buf_appendcstr(&h, "Auto: ");
        val = lmtp_sieve_header1(run, ctx, "subject", &v);
        lmtp_sieve_safe(&h, val ? val : "", 900);
    }
    localtime_r(&now, &tm);
    strftime(date, sizeof(date), "%a, %d %b %Y %H:%M:%S %z", &tm);
    buf_printf(&h, "\r\nDate: %s\r\nMessage-ID: <sieve.%lld.%ld.%lu@%s>\r\n",
               date, (long long)now, (long)getpid(), ++ls->seq,
               run->m->servername);
    if (run->m->msgid) {
        buf_appendcstr(&h, "In-Reply-To: ");
        lmtp_sieve_safe(&h, run->m->msgid, 998);
        buf_appendcstr(&h, "\r\nReferences: ");
        if ((val = lmtp_sieve_header1(run, ctx, "references", &v)) != NULL) {
            lmtp_sieve_safe(&h, val, 4000);
            buf_appendcstr(&h, " ");
        }
        lmtp_sieve_safe(&h, run->m->msgid, 998);
        buf_appendcstr(&h, "\r\n");
    }
    buf_appendcstr(&h, "Auto-Submitted: auto-replied (vacation)\r\n"
                       "MIME-Version: 1.0\r\n");
    if (!a->mime)
        buf_appendcstr(&h, "Content-Type: text/plain; charset=utf-8\r\n"
                           "Content-Transfer-Encoding: 8bit\r\n\r\n");
    {
        /* the body, with CRLF line ends */
        const char *t = a->text ? a->text : "";

        for (; *t; t++) {
            if (*t == '\n' && (t == a->text || t[-1] != '\r'))
                buf_putc(&h, '\r');
            buf_putc(&h, *t);
        }
        buf_appendcstr(&h, "\r\n");
    }
    if (!h.s) {
        r = -1;
        *why_r = "out of memory";
        goto out;
    }
    if (lmtp_sieve_sendmail(ls, "<>", sender, h.s, h.len, NULL, 0) != 0) {
        r = -1;
        *why_r = "sendmail failed";
        goto out;
    }
    if (lmtp_sieve_remember(ls, buf_cstring(&key), run->userid,
                            a->seconds ? a->seconds : 7 * 86400) != 0)
        log_warning("lmtp: sieve vacation not remembered user=<%s>",
                    run->userid);
    r = 1;
out:
    strarray_fini(&mine);
    strarray_fini(&v);
    buf_free(&key);
    buf_free(&h);
    return r;
}

/* ---- editheader (RFC 5293) --------------------------------------------
 *
 * The recipient's header as its script edited it, one field per entry
 * (continuation lines and CRLF included), over the staged message.  The
 * edits are applied in script order; a local target or a redirect gets
 * the header as it stands at that action.  A state that a local target
 * needs becomes a stage of its own (a new message file: the other
 * recipients keep the single-instance original), added to the same
 * deliver_message() call, hence to the same durable commit.
 */
#define LMTP_SIEVE_EDIT_GROWTH (64 * 1024)  /* bytes edits may add in all */
#define LMTP_SIEVE_FIELD_MAX 8192           /* bytes of one added field */

struct lmtp_sieve_hdr {
    struct strarray fields;
    const char *body;          /* after the header's empty line */
    size_t bodylen;
    const char *blank;         /* the empty line ("\r\n", or "" when the
                                  message is all header) */
    size_t added;              /* bytes the edits added */
    int usable;                /* parsed: edits can apply */
    int edits;                 /* edits applied so far */
    int staged_at;             /* edits when `st` was made; -1 none */
    struct append_stage *st;
};

/* Split the staged message's header into fields.  0, or -1 when it
 * cannot be edited (NUL bytes, no memory): the edits are then ignored. */
static int lmtp_sieve_hdr_init(struct lmtp_sieve_hdr *h, const char *map,
                               size_t len)
{
    size_t i = 0, start;

    memset(h, 0, sizeof(*h));
    h->staged_at = -1;
    h->blank = "";
    if (len && memchr(map, '\0', len))
        return -1;
    while (i < len) {
        if (map[i] == '\r' && i + 1 < len && map[i + 1] == '\n') {
            h->blank = "\r\n";
            i += 2;
            break;
        }
        if (map[i] == '\n') {
            h->blank = "\r\n";
            i += 1;
            break;
        }
        start = i;
        do {   /* one field with its continuation lines */
            const char *nl = memchr(map + i, '\n', len - i);
            i = nl ? (size_t)(nl - map) + 1 : len;
        } while (i < len && (map[i] == ' ' || map[i] == '\t'));
        {
            char *f = strndup(map + start, i - start);
            if (!f || strarray_appendm(&h->fields, f) < 0) {
                free(f);
                return -1;
            }
        }
    }
    h->body = map + i;
    h->bodylen = len - i;
    h->usable = 1;
    return 0;
}

static void lmtp_sieve_hdr_fini(struct lmtp_sieve_hdr *h)
{
    strarray_fini(&h->fields);
}

/* Does field f (raw bytes) have name `name`?  The name as the script's
 * header tests see it (sieve_msg.c): exactly the bytes before the
 * colon, so that deleteheader's index counts the same fields. */
static int lmtp_sieve_field_is(const char *f, const char *name)
{
    size_t n = strlen(name);

    return strncasecmp(f, name, n) == 0 && f[n] == ':';
}

static void lmtp_sieve_b64(struct buf *out, const unsigned char *p, size_t n)
{
    static const char tab[] =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t i;

    for (i = 0; i + 2 < n; i += 3) {
        buf_putc(out, tab[p[i] >> 2]);
        buf_putc(out, tab[((p[i] & 3) << 4) | (p[i + 1] >> 4)]);
        buf_putc(out, tab[((p[i + 1] & 15) << 2) | (p[i + 2] >> 6)]);
        buf_putc(out, tab[p[i + 2] & 63]);
    }
    if (n - i == 1) {
        buf_putc(out, tab[p[i] >> 2]);
        buf_putc(out, tab[(p[i] & 3) << 4]);
        buf_appendcstr(out, "==");
    } else if (n - i == 2) {
        buf_putc(out, tab[p[i] >> 2]);
        buf_putc(out, tab[((p[i] & 3) << 4) | (p[i + 1] >> 4)]);
        buf_putc(out, tab[(p[i + 1] & 15) << 2]);
        buf_putc(out, '=');
    }
}

/* "Name: value\r\n" for addheader: line ends and tabs in the value
 * become spaces; a printable US-ASCII value is folded at its spaces
 * (lines of about 78 bytes); any other value is written as RFC 2047
 * encoded words (UTF-8, B), at most 45 octets of the value each, cut at
 * character boundaries, one per line of at most 76 characters.  0, or -1
 * when the field would be longer than LMTP_SIEVE_FIELD_MAX or its name
 * alone would make a line too long (RFC 5322 2.1.1: 998). */
static int lmtp_sieve_field(const char *name, const char *value,
                            struct buf *out)
{
    struct buf v = BUF_INITIALIZER;
    size_t i, col, word = 0, longest = 0;
    int ascii = 1;

    buf_reset(out);
    if (strlen(name) > 900)
        return -1;
    for (i = 0; value[i]; i++) {
        unsigned char c = (unsigned char)value[i];

        if (c == '\r' || c == '\n' || c == '\t')
            c = ' ';
        if (c < 32 || c > 126)
            ascii = 0;
        word = c == ' ' ? 0 : word + 1;
        if (word > longest)
            longest = word;
        buf_putc(&v, (char)c);
    }
    buf_printf(out, "%s:", name);
    col = out->len;
    if (ascii && longest < 900) {
        const char *p = v.s ? buf_cstring(&v) : "";

        for (;;) {
            const char *sp = strchr(p, ' ');
            size_t n = sp ? (size_t)(sp - p) : strlen(p);

            if (col + 1 + n > 78 && col > strlen(name) + 1) {
                buf_appendcstr(out, "\r\n");
                col = 0;
            }
            buf_putc(out, ' ');
            buf_append(out, p, n);
            col += 1 + n;
            if (!sp)
                break;
            p = sp + 1;
        }
    } else {
        const unsigned char *p = (const unsigned char *)(v.s ? v.s : "");
        size_t len = v.len, n, max;

        /* lines of at most 76 characters (RFC 2047 2): " =?UTF-8?B?"
         * and "?=" take 13, 60 base64 characters carry 45 octets; the
         * first word shares its line with "Name:" */
        max = col + 13 + 4 <= 76 ? (76 - col - 13) / 4 * 3 : 0;
        if (max > 45)
            max = 45;
        if (max == 0) {
            buf_appendcstr(out, "\r\n");
            max = 45;
        }
        for (i = 0; i < len; i += n) {
            n = len - i > max ? max : len - i;
            while (n > 1 && i + n < len && (p[i + n] & 0xc0) == 0x80)
                n--;   /* not inside a UTF-8 sequence */
            if (i)
                buf_appendcstr(out, "\r\n");
            max = 45;
            buf_appendcstr(out, " =?UTF-8?B?");
            lmtp_sieve_b64(out, p + i, n);
            buf_appendcstr(out, "?=");
        }
    }
    buf_appendcstr(out, "\r\n");
    buf_free(&v);
    if (!out->s || out->len > LMTP_SIEVE_FIELD_MAX) {
        buf_reset(out);
        return -1;
    }
    return 0;
}

/* Apply one ADDHEADER / DELETEHEADER action.  Received and
 * Auto-Submitted fields are never added or deleted (RFC 5293 section 7:
 * the library already ignores such commands; this is the store's own
 * guard).  *why_r says why an edit was not applied. */
static void lmtp_sieve_hdr_edit(struct lmtp_sieve_hdr *h,
                                const struct sieve_action *a,
                                const char **why_r)
{
    struct buf f = BUF_INITIALIZER;
    size_t i, seen = 0;

    *why_r = NULL;
    if (!h->usable) {
        *why_r = "header not editable";
        return;
    }
    if (!a->name || strcasecmp(a->name, "received") == 0 ||
        strcasecmp(a->name, "auto-submitted") == 0) {
        *why_r = "protected field";
        return;
    }
    if (a->type == SIEVE_ACTION_ADDHEADER) {
        if (lmtp_sieve_field(a->name, a->text ? a->text : "", &f) != 0) {
            *why_r = "field too long";
            goto out;
        }
        if (h->added + f.len > LMTP_SIEVE_EDIT_GROWTH) {
            *why_r = "edits too large";
            goto out;
        }
        if (strarray_append(&h->fields, buf_cstring(&f)) < 0) {
            *why_r = "out of memory";
            goto out;
        }
        if (!a->last)   /* RFC 5293 4: first by default */
            for (i = h->fields.count - 1; i > 0; i--) {
                char *t = h->fields.data[i];
                h->fields.data[i] = h->fields.data[i - 1];
                h->fields.data[i - 1] = t;
            }
        h->added += f.len;
        h->edits++;
        goto out;
    }
    for (i = 0; i < h->fields.count; i++)
        if (lmtp_sieve_field_is(h->fields.data[i], a->name) &&
            ++seen == a->index) {
            strarray_remove(&h->fields, i);
            h->edits++;
            goto out;
        }
    *why_r = "no such field";
out:
    buf_free(&f);
}

/* The edited header's bytes (fields and the empty line) into out. */
static int lmtp_sieve_hdr_bytes(const struct lmtp_sieve_hdr *h,
                                struct buf *out)
{
    size_t i;

    buf_reset(out);
    for (i = 0; i < h->fields.count; i++)
        buf_appendcstr(out, h->fields.data[i]);
    buf_appendcstr(out, h->blank);
    return out->s ? 0 : -1;
}

/* The stage holding the message as edited so far, for a local target:
 * NULL when nothing was edited (the original stage serves).  A new stage
 * is made when the header changed since the last one; it is kept in
 * res->stages.  0, or -1 (I/O: a temporary failure). */
static int lmtp_sieve_hdr_stage(struct lmtp_sieve *ls,
                                struct lmtp_sieve_hdr *h,
                                struct lmtp_sieve_result *res,
                                struct append_stage **st_r)
{
    struct append_stage *st = NULL, **nv;
    struct buf head = BUF_INITIALIZER;
    int r;

    *st_r = NULL;
    if (h->edits == 0)
        return 0;
    if (h->staged_at == h->edits) {
        *st_r = h->st;
        return 0;
    }
    nv = realloc(res->stages, (res->nstages + 1) * sizeof(*nv));
    if (!nv)
        return -1;
    res->stages = nv;
    if (lmtp_sieve_hdr_bytes(h, &head) != 0) {
        buf_free(&head);
        return -1;
    }
    r = append_stage_open(ls->conf, NULL, &st);
    if (r == STORE_OK) {
        /* the edits are the server's: maxmessagesize is the client's */
        append_stage_allow_extra(st, h->added);
        r = append_stage_write(st, head.s, head.len);
    }
    if (r == STORE_OK && h->bodylen)
        r = append_stage_write(st, h->body, h->bodylen);
    if (r == STORE_OK)
        r = append_stage_close(st);
    buf_free(&head);
    if (r != STORE_OK) {
        log_error("lmtp: sieve cannot stage the edited message error=<%s>",
                  store_strerror(r));
        append_stage_free(&st);
        return -1;
    }
    res->stages[res->nstages++] = st;
    h->st = st;
    h->staged_at = h->edits;
    *st_r = st;
    return 0;
}

/* ---- redirect ---------------------------------------------------------- */

/* 1 sent or rightly skipped (*why_r), -1 sendmail or database failure. */
static int lmtp_sieve_redirect(struct lmtp_sieve_run *run,
                               struct sieve_message_ctx *ctx,
                               const struct sieve_action *a,
                               const struct lmtp_sieve_hdr *hdr,
                               const char **why_r)
{
    struct lmtp_sieve *ls = run->ls;
    struct lmtp_sieve_msg *m = run->m;
    struct strarray v = STRARRAY_INITIALIZER;
    struct buf key = BUF_INITIALIZER, trace = BUF_INITIALIZER;
    const char *sender = m->sender[0] ? m->sender : "<>";
    size_t i;
    int r = 1;

    *why_r = "sent";
    /* our own trace from an earlier pass: a loop */
    buf_printf(&trace, "%s@%s", run->userid, m->servername);
    if (ctx->header(&run->sm, LMTP_SIEVE_TRACE, 1, &v) == 0)
        for (i = 0; i < v.count; i++)
            if (strcasecmp(v.data[i], buf_cstring(&trace)) == 0) {
                *why_r = "loop";
                goto out;
            }
    if (m->msgid) {
        buf_printf(&key, "sieve-redirect:%s", m->msgid);
        r = lmtp_sieve_remembered(ls, buf_cstring(&key), a->address);
        if (r != 0) {
            *why_r = r > 0 ? "already redirected" : "database error";
            r = r > 0 ? 1 : -1;
            goto out;
        }
    }
    {
        struct buf head = BUF_INITIALIZER;

        struct buf edited = BUF_INITIALIZER;
        const char *body = m->map;
        size_t bodylen = m->maplen;

        buf_printf(&head, LMTP_SIEVE_TRACE ": %s\r\n", buf_cstring(&trace));
        if (hdr->edits) {   /* the header as the script left it so far */
            if (lmtp_sieve_hdr_bytes(hdr, &edited) == 0)
                buf_append(&head, edited.s, edited.len);
            else
                buf_free(&head);
            body = hdr->body;
            bodylen = hdr->bodylen;
        }
        r = head.s ? lmtp_sieve_sendmail(ls, sender, a->address, head.s,
                                         head.len, body, bodylen) : -1;
        buf_free(&head);
        buf_free(&edited);
    }
    if (r != 0) {
        *why_r = "sendmail failed";
        r = -1;
        goto out;
    }
    r = 1;
    if (m->msgid &&
        lmtp_sieve_remember(ls, buf_cstring(&key), a->address, 5 * 86400))
        log_warning("lmtp: sieve redirect not remembered to=<%s>",
                    a->address);
out:
    strarray_fini(&v);
    buf_free(&key);
    buf_free(&trace);
    return r;
}

/* ---- actions -> targets ------------------------------------------------- */

static uint32_t lmtp_sieve_sysflag(const char *f)
{
    static const struct { const char *name; uint32_t bit; } sys[] = {
        { "\\seen", MAILBOX_FLAG_SEEN },
        { "\\answered", MAILBOX_FLAG_ANSWERED },
        { "\\flagged", MAILBOX_FLAG_FLAGGED },
        { "\\deleted", MAILBOX_FLAG_DELETED },
        { "\\draft", MAILBOX_FLAG_DRAFT },
    };
    size_t i;

    for (i = 0; i < sizeof(sys) / sizeof(sys[0]); i++)
        if (strcasecmp(f, sys[i].name) == 0)
            return sys[i].bit;
    return 0;
}

/* An IMAP flag keyword: atom characters, not empty, not too long. */
static int lmtp_sieve_keyword_ok(const char *f)
{
    size_t i;

    if (!f[0] || strlen(f) > 100)
        return 0;
    for (i = 0; f[i]; i++) {
        unsigned char c = (unsigned char)f[i];
        if (c <= 32 || c >= 127 || strchr("(){%*\"\\]", c))
            return 0;
    }
    return 1;
}

static int lmtp_sieve_add_target(struct lmtp_sieve_result *res,
                                 const char *mailbox,
                                 const struct strarray *flags,
                                 struct append_stage *stage)
{
    struct lmtp_sieve_target *t, *nt;
    size_t i;

    for (i = 0; i < res->ntargets; i++)
        if (strcmp(res->targets[i].mailbox, mailbox) == 0)
            break;
    if (i == res->ntargets) {
        nt = realloc(res->targets, (res->ntargets + 1) * sizeof(*nt));
        if (!nt)
            return -1;
        res->targets = nt;
        t = &nt[res->ntargets];
        memset(t, 0, sizeof(*t));
        t->mailbox = strdup(mailbox);
        if (!t->mailbox)
            return -1;
        t->stage = stage;   /* a second action for it keeps the first's */
        res->ntargets++;
    } else {
        t = &res->targets[i];
    }
    for (i = 0; flags && i < flags->count; i++) {
        uint32_t bit = lmtp_sieve_sysflag(flags->data[i]);

        if (bit)
            t->sysflags |= bit;
        else if (flags->data[i][0] != '\\' &&
                 lmtp_sieve_keyword_ok(flags->data[i]))
            strarray_append(&t->keywords, flags->data[i]);
    }
    return 0;
}

static void lmtp_sieve_log_action(struct buf *log, const char *text)
{
    if (log->len)
        buf_appendcstr(log, "; ");
    buf_appendcstr(log, text);
}

/* WHAT "NAME" in the actions list, without a format */
static void lmtp_sieve_log_named(struct buf *log, const char *what,
                                 const char *name)
{
    lmtp_sieve_log_action(log, what);
    buf_appendcstr(log, " \"");
    buf_appendcstr(log, name);
    buf_putc(log, '"');
}

/* the local zone's offset now, in minutes: localtime_r() once a minute
 * (zones change their offsets on whole minutes) */
static int lmtp_sieve_zone(struct lmtp_sieve *ls, time_t now)
{
    if (!ls->zone_known || now / 60 != ls->zone_minute) {
        struct tm tm;

        if (!localtime_r(&now, &tm))
            return 0;
        ls->zone_offset = (int)(tm.tm_gmtoff / 60);
        ls->zone_minute = now / 60;
        ls->zone_known = 1;
    }
    return ls->zone_offset;
}

void lmtp_sieve_run(struct lmtp_sieve *ls, struct lmtp_sieve_msg *m,
                    const char *rcpt, const char *mailbox,
                    struct lmtp_sieve_result *res)
{
    struct lmtp_sieve_run run;
    struct sieve_message_ctx ctx;
    struct sieve_actions acts = SIEVE_ACTIONS_INITIALIZER;
    struct buf userid = BUF_INITIALIZER, inbox = BUF_INITIALIZER;
    struct buf path = BUF_INITIALIZER, err = BUF_INITIALIZER;
    struct buf log = BUF_INITIALIZER, name = BUF_INITIALIZER;
    struct buf udir = BUF_INITIALIZER;
    const struct lmtp_sieve_compiled *c;
    struct lmtp_sieve_cached *e;
    struct stat sb;
    char scriptname[256], bcname[256], clog[2048], crcpt[300];
    const char *status = "ok";
    ssize_t n;
    size_t i;
    struct lmtp_sieve_hdr hdr;
    int fd = -1, r, tempfail = 0, hdr_set = 0, hdr_parsed = 0, named = 0;
    unsigned long loads = ls->bcloads;

    memset(res, 0, sizeof(*res));
    res->outcome = LMTP_SIEVE_NONE;
    if (!mailbox || !mboxname_userid(mailbox, &userid) ||
        mboxname_user_inbox(buf_cstring(&userid), &inbox) != STORE_OK)
        goto out;   /* a shared mailbox: no script */
    for (i = 0; i < userid.len; i++)
        if (userid.s[i] == '^')
            userid.s[i] = '.';
    if (sievedir_active_path(ls->conf, buf_cstring(&userid), &path) != 0)
        goto out;
    ls->run_tick = ls->tick;   /* entries used from here on are in use */
    /* an active script unchanged since its entry was made costs one
     * stat(), through the link: no open, no read */
    if (stat(buf_cstring(&path), &sb) != 0) {
        if (errno != ENOENT && errno != ENOTDIR)
            log_warning("lmtp: sieve script unreadable script=<%s> "
                        "error=<%s>", buf_cstring(&path), strerror(errno));
        goto out;   /* no active script */
    }
    e = lmtp_sieve_cache_find(ls, &sb);
    if (e && e->name) {
        snprintf(scriptname, sizeof(scriptname), "%s", e->name);
    } else {
        size_t tl, sl = strlen(SIEVEDIR_SUFFIX);
        size_t ll = strlen(SIEVEDIR_ACTIVE_LINK) + 1;

        e = NULL;
        n = readlink(buf_cstring(&path), scriptname, sizeof(scriptname) - 1);
        scriptname[n > 0 ? n : 0] = '\0';
        if (n <= 0)
            snprintf(scriptname, sizeof(scriptname), "%s",
                     SIEVEDIR_ACTIVE_LINK);
        /* the compiled form beside the link's target: DIR/NAME.bc */
        tl = strlen(scriptname);
        named = tl > sl && !strchr(scriptname, '/') &&
                strcmp(scriptname + tl - sl, SIEVEDIR_SUFFIX) == 0 &&
                path.len > ll;
        if (named) {
            memcpy(bcname, scriptname, tl - sl);
            bcname[tl - sl] = '\0';
            named = buf_setmap(&udir, path.s, path.len - ll) == 0;
        }
        /* a compiled form that names the file stat() found as its
         * source is taken without opening the text */
        if (named)
            e = lmtp_sieve_load(ls, -1, &sb, buf_cstring(&path),
                                buf_cstring(&udir), bcname, scriptname);
        if (!e) {
            fd = open(buf_cstring(&path), O_RDONLY | O_CLOEXEC);
            if (fd < 0) {
                if (errno != ENOENT && errno != ENOTDIR)
                    log_warning("lmtp: sieve script unreadable script=<%s> "
                                "error=<%s>", buf_cstring(&path),
                                strerror(errno));
                goto out;   /* no active script */
            }
        }
    }
    res->userid = strdup(buf_cstring(&userid));
    if (!res->userid)
        goto tempfail;
    res->outcome = LMTP_SIEVE_DONE;
    if (!e)
        e = lmtp_sieve_load(ls, fd, NULL, buf_cstring(&path),
                            named ? buf_cstring(&udir) : NULL,
                            named ? bcname : NULL, scriptname);
    c = e ? e->comp : NULL;
    if (!c) {
        log_error("lmtp: sieve script unreadable script=<%s> error=<%s>",
                  buf_cstring(&path), strerror(errno));
        goto keep;
    }
    if (!c->script) {
        log_error("lmtp: sieve script does not compile user=<%s> "
                  "script=<%s> error=<%s>; implicit keep",
                  res->userid, scriptname, c->error ? c->error : "");
        status = "compile-error";
        goto keep;
    }
    if (lmtp_sieve_map(m) != 0) {
        log_error("lmtp: sieve cannot read the staged message error=<%s>",
                  strerror(errno));
        goto tempfail;
    }

    memset(&run, 0, sizeof(run));
    sieve_msg_init(&run.sm, m->map, m->maplen);
    run.sm.env_from = m->sender;
    strarray_append(&run.sm.env_to, rcpt);
    run.ls = ls;
    run.m = m;
    run.userid = res->userid;
    run.inbox = buf_cstring(&inbox);
    run.keep = mailbox;
    run.rcpt = rcpt;
    sieve_msg_ctx(&run.sm, &ctx);
    ctx.mailbox_exists = lmtp_sieve_cb_mailbox_exists;
    ctx.duplicate_check = lmtp_sieve_cb_duplicate;
    ctx.environment = lmtp_sieve_cb_environment;
    ctx.include = lmtp_sieve_cb_include;
    ctx.now = time(NULL);
    ctx.zone_minutes = lmtp_sieve_zone(ls, ctx.now);
    ctx.size = m->maplen;

    r = sieve_execute(c->script, &ctx, &acts, &err);
    if (r == SIEVE_ETEMP || r == SIEVE_ENOMEM) {
        sieve_msg_fini(&run.sm);
        log_error("lmtp: sieve temporary failure user=<%s> script=<%s> "
                  "error=<%s>", res->userid, scriptname,
                  err.len ? buf_cstring(&err) : sieve_strerror(r));
        goto tempfail;
    }
    if (r != SIEVE_OK) {
        log_error("lmtp: sieve runtime error user=<%s> script=<%s> "
                  "error=<%s>; implicit keep", res->userid, scriptname,
                  err.len ? buf_cstring(&err) : sieve_strerror(r));
        status = "runtime-error";
    }

    /* the header is split into fields at the first edit only */
    memset(&hdr, 0, sizeof(hdr));
    hdr_set = 1;
    for (i = 0; i < acts.count && !tempfail; i++) {
        struct sieve_action *a = &acts.v[i];
        struct append_stage *stage = NULL;
        const char *why = NULL;
        struct buf one = BUF_INITIALIZER;

        switch (a->type) {
        case SIEVE_ACTION_KEEP:
            if (lmtp_sieve_hdr_stage(ls, &hdr, res, &stage) != 0) {
                tempfail = 1;
                break;
            }
            lmtp_sieve_add_target(res, mailbox, &a->flags, stage);
            lmtp_sieve_log_action(&log, a->implicit ? "keep implicit"
                                                    : "keep");
            break;
        case SIEVE_ACTION_DISCARD:
            lmtp_sieve_log_action(&log, "discard");
            break;
        case SIEVE_ACTION_FILEINTO: {
            const char *target = NULL;
            int ok;

            if (a->specialuse) {
                /* RFC 8579 4: the mailbox with that use first, the
                 * named one after */
                ok = lmtp_sieve_specialuse(&run, a->specialuse, &name);
                if (ok < 0) {
                    tempfail = 1;
                    break;
                }
                if (ok)
                    target = buf_cstring(&name);
            }
            if (!target &&
                lmtp_sieve_mboxname(&run, a->mailbox, &name) == 0) {
                ok = lmtp_sieve_postable(&run, buf_cstring(&name));
                if (ok < 0) {
                    tempfail = 1;
                    break;
                }
                if (ok) {
                    target = buf_cstring(&name);
                } else if (a->create &&
                           mboxname_is_self_or_child(run.inbox,
                                                     buf_cstring(&name))) {
                    /* with :specialuse the new mailbox gets the use
                     * (RFC 8579 4) */
                    const char *use = a->specialuse
                        ? lmtp_sieve_specialuse_canon(a->specialuse) : NULL;

                    r = mboxlist_create_special(deliver_mboxlist(ls->dctx),
                                                buf_cstring(&name), NULL,
                                                NULL, use, NULL);
                    if (r == STORE_OK || r == STORE_EXISTS) {
                        target = buf_cstring(&name);
                        log_info("lmtp: sieve created mailbox=<%s> "
                                 "user=<%s>%s%s%s", target, res->userid,
                                 use && r == STORE_OK ? " specialuse=<" : "",
                                 use && r == STORE_OK ? use : "",
                                 use && r == STORE_OK ? ">" : "");
                    } else {
                        log_warning("lmtp: sieve cannot create "
                                    "mailbox=<%s> error=<%s>",
                                    buf_cstring(&name), store_strerror(r));
                    }
                }
            }
            if (!target) {
                log_info("lmtp: sieve fileinto target missing user=<%s> "
                         "folder=<%s>; into INBOX", res->userid,
                         a->mailbox);
                target = run.inbox;
            }
            if (lmtp_sieve_hdr_stage(ls, &hdr, res, &stage) != 0) {
                tempfail = 1;
                break;
            }
            lmtp_sieve_add_target(res, target, &a->flags, stage);
            lmtp_sieve_log_named(&log, "fileinto", target);
            break;
        }
        case SIEVE_ACTION_REDIRECT:
            if (lmtp_sieve_redirect(&run, &ctx, a, &hdr, &why) < 0)
                tempfail = 1;
            buf_printf(&one, "redirect \"%s\" (%s)", a->address, why);
            lmtp_sieve_log_action(&log, buf_cstring(&one));
            break;
        case SIEVE_ACTION_REJECT:
        case SIEVE_ACTION_EREJECT: {
            struct buf reason = BUF_INITIALIZER;
            size_t j;

            lmtp_sieve_safe(&reason, a->text ? a->text : "", 400);
            for (j = 0; j < reason.len; j++)   /* a reply line: ASCII */
                if ((unsigned char)reason.s[j] < 32 ||
                    (unsigned char)reason.s[j] > 126)
                    reason.s[j] = '?';
            free(res->reason);
            res->reason = buf_release(&reason);
            if (!res->reason)
                res->reason = strdup("");
            res->outcome = LMTP_SIEVE_REJECT;
            lmtp_sieve_log_action(&log, a->type == SIEVE_ACTION_REJECT
                                            ? "reject" : "ereject");
            break;
        }
        case SIEVE_ACTION_VACATION:
            if (lmtp_sieve_vacation(&run, &ctx, a, &why) < 0)
                tempfail = 1;
            buf_printf(&one, "vacation (%s)", why);
            lmtp_sieve_log_action(&log, buf_cstring(&one));
            break;
        case SIEVE_ACTION_DUPLICATE: {
            unsigned long *nd = realloc(res->dupsecs,
                                        (res->dupmarks.count + 1) *
                                            sizeof(*nd));
            if (nd) {
                res->dupsecs = nd;
                nd[res->dupmarks.count] = a->seconds;
                strarray_append(&res->dupmarks, a->text ? a->text : "");
            }
            break;
        }
        case SIEVE_ACTION_ADDHEADER:
        case SIEVE_ACTION_DELETEHEADER:
            if (!hdr_parsed) {
                hdr_parsed = 1;
                if (lmtp_sieve_hdr_init(&hdr, m->map, m->maplen) != 0)
                    log_warning("lmtp: sieve header not editable "
                                "user=<%s>", res->userid);
            }
            lmtp_sieve_hdr_edit(&hdr, a, &why);
            buf_printf(&one, "%s \"%s\"%s%s%s",
                       a->type == SIEVE_ACTION_ADDHEADER ? "addheader"
                                                        : "deleteheader",
                       a->name ? a->name : "", why ? " (" : "",
                       why ? why : "", why ? ")" : "");
            lmtp_sieve_log_action(&log, buf_cstring(&one));
            break;
        }
        buf_free(&one);
    }
    sieve_msg_fini(&run.sm);
    if (tempfail)
        goto tempfail;
    goto done;

keep:
    lmtp_sieve_add_target(res, mailbox, NULL, NULL);
    lmtp_sieve_log_action(&log, "keep implicit");
    goto done;
tempfail:
    status = "tempfail";
    res->outcome = LMTP_SIEVE_TEMPFAIL;
done:
    log_sanitize(log.s ? log.s : "", log.len, clog, sizeof(clog));
    log_sanitize(rcpt, strlen(rcpt), crcpt, sizeof(crcpt));
    log_info("lmtp: sieve rcpt=<%s> user=<%s> script=<%s> result=<%s> "
             "loaded=<%lu> actions=<%s>", crcpt,
             res->userid ? res->userid : "", scriptname, status,
             ls->bcloads - loads, clog);
out:
    if (hdr_set)
        lmtp_sieve_hdr_fini(&hdr);
    if (fd >= 0)
        close(fd);
    sieve_actions_fini(&acts);
    buf_free(&userid);
    buf_free(&inbox);
    buf_free(&path);
    buf_free(&err);
    buf_free(&log);
    buf_free(&name);
    buf_free(&udir);
}

void lmtp_sieve_commit(struct lmtp_sieve *ls,
                       const struct lmtp_sieve_result *res)
{
    struct buf key = BUF_INITIALIZER;
    size_t i;

    for (i = 0; i < res->dupmarks.count; i++) {
        buf_reset(&key);
        buf_printf(&key, "sieve-duplicate:%s", res->dupmarks.data[i]);
        if (lmtp_sieve_remember(ls, buf_cstring(&key), res->userid,
                                res->dupsecs[i]) != 0)
            log_warning("lmtp: sieve duplicate mark not written user=<%s>",
                        res->userid);
    }
    buf_free(&key);
}

void lmtp_sieve_result_fini(struct lmtp_sieve_result *res)
{
    size_t i;

    for (i = 0; i < res->ntargets; i++) {
        free(res->targets[i].mailbox);
        strarray_fini(&res->targets[i].keywords);
    }
    free(res->targets);
    for (i = 0; i < res->nstages; i++)
        append_stage_free(&res->stages[i]);
    free(res->stages);
    free(res->reason);
    free(res->userid);
    free(res->dupsecs);
    strarray_fini(&res->dupmarks);
    memset(res, 0, sizeof(*res));
}
