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
 */
#include "config.h"

#include <errno.h>
#include <stdint.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
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
#include "sieve/sieve.h"
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

/* A compiled text, shared by every cache entry whose file holds the same
 * bytes (users with identical scripts, as a webmail's filter editor
 * writes them, compile once per process). */
struct lmtp_sieve_compiled {
    char *text;                    /* the script's bytes, for comparison */
    size_t len;
    uint64_t hash;                 /* FNV-1a of the bytes */
    struct sieve_script *script;   /* NULL: the script does not compile */
    char *error;                   /* its compile error */
    unsigned refs;                 /* cache entries pointing here */
};

struct lmtp_sieve_cached {
    dev_t dev;
    ino_t ino;
    off_t size;
    struct timespec mtime;
    struct lmtp_sieve_compiled *comp;
    unsigned long used;
    int valid;
};

struct lmtp_sieve {
    const struct imapconf *conf;
    struct deliver_ctx *dctx;
    struct sieve_limits limits;
    struct strarray allowed;
    struct lmtp_sieve_cached cache[LMTP_SIEVE_CACHE];
    unsigned long tick;
    unsigned long compiles;
    unsigned long seq;
};

/* Extensions whose actions this delivery path does not carry out: never
 * offered to scripts. */
static const char *const lmtp_sieve_unsupported[] = {
    "editheader", "include", "special-use", NULL
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
    *ls_r = ls;
    return 0;
}

static void lmtp_sieve_cache_drop(struct lmtp_sieve_cached *c)
{
    struct lmtp_sieve_compiled *k = c->comp;

    if (k && --k->refs == 0) {
        sieve_script_free(&k->script);
        free(k->error);
        free(k->text);
        free(k);
    }
    memset(c, 0, sizeof(*c));
}

void lmtp_sieve_free(struct lmtp_sieve **lsp)
{
    struct lmtp_sieve *ls = *lsp;
    size_t i;

    if (!ls)
        return;
    for (i = 0; i < LMTP_SIEVE_CACHE; i++)
        lmtp_sieve_cache_drop(&ls->cache[i]);
    strarray_fini(&ls->allowed);
    free(ls);
    *lsp = NULL;
}

unsigned long lmtp_sieve_compiles(const struct lmtp_sieve *ls)
{
    return ls->compiles;
}

/* ---- the compiled-script cache ------------------------------------------ */

static uint64_t lmtp_sieve_hash(const char *p, size_t len)
{
    uint64_t h = 14695981039346656037ULL;
    size_t i;

    for (i = 0; i < len; i++) {
        h ^= (unsigned char)p[i];
        h *= 1099511628211ULL;
    }
    return h;
}

/* Read the whole open file fd into text (at most max + 1 bytes).  0, or
 * -1 (errno set). */
static int lmtp_sieve_read(int fd, size_t max, struct buf *text)
{
    char chunk[8192];
    ssize_t n;

    for (;;) {
        n = read(fd, chunk, sizeof(chunk));
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -1;
        if (n == 0)
            return 0;
        if (buf_append(text, chunk, (size_t)n) != 0) {
            errno = ENOMEM;
            return -1;
        }
        if (text->len > max)
            return 0;
    }
}

/* The compiled script behind the open file fd (path for logs): the cache
 * entry of the file (device, inode, size, mtime), else the compiled form
 * of another entry whose file holds the same bytes, else a compilation.
 * Returns the compiled text (script NULL with error set when it did not
 * compile), or NULL on an I/O or memory failure. */
static const struct lmtp_sieve_compiled *
lmtp_sieve_load(struct lmtp_sieve *ls, int fd, const char *path)
{
    struct lmtp_sieve_cached *c, *victim = NULL;
    struct lmtp_sieve_compiled *k = NULL;
    struct stat sb;
    struct buf text = BUF_INITIALIZER, err = BUF_INITIALIZER;
    uint64_t hash;
    size_t i;
    int r;

    if (fstat(fd, &sb) != 0)
        return NULL;
    ls->tick++;
    for (i = 0; i < LMTP_SIEVE_CACHE; i++) {
        c = &ls->cache[i];
        if (c->valid && c->dev == sb.st_dev && c->ino == sb.st_ino &&
            c->size == sb.st_size &&
            c->mtime.tv_sec == sb.st_mtim.tv_sec &&
            c->mtime.tv_nsec == sb.st_mtim.tv_nsec) {
            c->used = ls->tick;
            return c->comp;
        }
        if (!victim || !c->valid || (victim->valid && c->used < victim->used))
            victim = c;
    }
    if ((size_t)sb.st_size > ls->limits.max_script_size + 1) {
        /* do not read more than the limit allows */
        r = SIEVE_ELIMIT;
        buf_printf(&err, "script of %lld bytes over sieve_maxscriptsize",
                   (long long)sb.st_size);
    } else {
        if (lmtp_sieve_read(fd, ls->limits.max_script_size, &text) != 0) {
            buf_free(&text);
            return NULL;
        }
        r = SIEVE_OK;
    }
    hash = lmtp_sieve_hash(text.s ? text.s : "", text.len);
    if (r == SIEVE_OK)
        for (i = 0; i < LMTP_SIEVE_CACHE && !k; i++) {
            struct lmtp_sieve_compiled *o = ls->cache[i].comp;

            if (ls->cache[i].valid && &ls->cache[i] != victim && o &&
                o->text && o->hash == hash && o->len == text.len &&
                memcmp(o->text, text.s ? text.s : "", text.len) == 0)
                k = o;
        }
    if (!k) {
        k = calloc(1, sizeof(*k));
        if (!k) {
            buf_free(&text);
            buf_free(&err);
            return NULL;
        }
        if (r == SIEVE_OK)
            r = sieve_compile(text.s ? text.s : "", text.len, &ls->limits,
                              &ls->allowed, &k->script, &err);
        if (r == SIEVE_ENOMEM) {
            free(k);
            buf_free(&text);
            buf_free(&err);
            return NULL;
        }
        ls->compiles++;
        if (r != SIEVE_OK)
            k->error = strdup(err.len ? buf_cstring(&err)
                                      : sieve_strerror(r));
        else if (text.len) {
            k->len = text.len;
            k->hash = hash;
            k->text = buf_release(&text);
        }
        log_info("lmtp: sieve compiled script=<%s> result=<%s>%s%s%s "
                 "compiles=<%lu>", path, r == SIEVE_OK ? "ok" : "error",
                 k->error ? " error=<" : "", k->error ? k->error : "",
                 k->error ? ">" : "", ls->compiles);
    }
    k->refs++;
    lmtp_sieve_cache_drop(victim);
    victim->comp = k;
    victim->dev = sb.st_dev;
    victim->ino = sb.st_ino;
    victim->size = sb.st_size;
    victim->mtime = sb.st_mtim;
    victim->used = ls->tick;
    victim->valid = 1;
    buf_free(&text);
    buf_free(&err);
    return k;
}

/* ---- the message as the script sees it ---------------------------------- */

struct lmtp_sieve_run {
    struct sieve_msg sm;          /* first: sieve_msg's callbacks' rock */
    struct lmtp_sieve *ls;
    struct lmtp_sieve_msg *m;
    const char *userid;
    const char *inbox;
    const char *rcpt;
};

static int lmtp_sieve_map(struct lmtp_sieve_msg *m)
{
    const char *path;
    struct stat sb;
    int fd;

    if (m->map)
        return 0;
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
        m->map = (void *)"";
        m->maplen = 0;
        return 0;
    }
    m->map = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
    close(fd);
    if (m->map == MAP_FAILED) {
        m->map = NULL;
        return -1;
    }
    m->maplen = (size_t)sb.st_size;
    return 0;
}

void lmtp_sieve_msg_fini(struct lmtp_sieve_msg *m)
{
    if (m->map && m->maplen)
        munmap(m->map, m->maplen);
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

/* Run `sendmail -i -f FROM -- TO` with head then body on stdin, within
 * lmtp_timeout seconds (then it is killed, with its process group).  0
 * when it exited 0, else -1 (logged). */
static int lmtp_sieve_sendmail(struct lmtp_sieve *ls, const char *from,
                               const char *to, const char *head,
                               size_t headlen, const char *body,
                               size_t bodylen)
{
    const char *prog = imapconf_getstring(ls->conf, "sendmail");
    long timeout = imapconf_getint(ls->conf, "lmtp_timeout");
    int pfd[2], status = -1, ok = 1, late = 0, pidfd;
    uint64_t deadline;
    pid_t pid;

    if (timeout <= 0)
        timeout = 300;
    deadline = 0;
    {
        struct timespec ts;

        clock_gettime(CLOCK_MONOTONIC, &ts);
        deadline = (uint64_t)ts.tv_sec * 1000 +
                   (uint64_t)ts.tv_nsec / 1000000 + (uint64_t)timeout * 1000;
    }
    if (pipe(pfd) != 0) {
        log_error("lmtp: sieve cannot run sendmail error=<%s>",
                  strerror(errno));
        return -1;
    }
    pid = fork();
    if (pid < 0) {
        log_error("lmtp: sieve cannot run sendmail error=<%s>",
                  strerror(errno));
        close(pfd[0]);
        close(pfd[1]);
        return -1;
    }
    if (pid == 0) {
        int devnull = open("/dev/null", O_WRONLY), fd;
        long maxfd = sysconf(_SC_OPEN_MAX);

        setpgid(0, 0);
        if (pfd[0] != 0) {
            dup2(pfd[0], 0);
            close(pfd[0]);
        }
        close(pfd[1]);
        if (devnull >= 0) {
            dup2(devnull, 1);
            close(devnull);
        }
        /* no listening socket or client connection goes with it */
        if (maxfd < 0 || maxfd > 65536)
            maxfd = 65536;
        if (close_range(3, ~0U, 0) != 0)
            for (fd = 3; fd < maxfd; fd++)
                close(fd);
        signal(SIGPIPE, SIG_DFL);
        execl(prog, "sendmail", "-i", "-f", from, "--", to, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);
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

/* ---- redirect ---------------------------------------------------------- */

/* 1 sent or rightly skipped (*why_r), -1 sendmail or database failure. */
static int lmtp_sieve_redirect(struct lmtp_sieve_run *run,
                               struct sieve_message_ctx *ctx,
                               const struct sieve_action *a,
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

        buf_printf(&head, LMTP_SIEVE_TRACE ": %s\r\n", buf_cstring(&trace));
        r = head.s ? lmtp_sieve_sendmail(ls, sender, a->address, head.s,
                                         head.len, m->map, m->maplen) : -1;
        buf_free(&head);
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
                                 const struct strarray *flags)
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
    const struct lmtp_sieve_compiled *c;
    char scriptname[256], clog[2048], crcpt[300];
    const char *status = "ok";
    ssize_t n;
    size_t i;
    int fd = -1, r, tempfail = 0;

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
    fd = open(buf_cstring(&path), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT && errno != ENOTDIR)
            log_warning("lmtp: sieve script unreadable script=<%s> "
                        "error=<%s>", buf_cstring(&path), strerror(errno));
        goto out;   /* no active script */
    }
    n = readlink(buf_cstring(&path), scriptname, sizeof(scriptname) - 1);
    scriptname[n > 0 ? n : 0] = '\0';
    if (n <= 0)
        snprintf(scriptname, sizeof(scriptname), "%s", SIEVEDIR_ACTIVE_LINK);
    res->userid = strdup(buf_cstring(&userid));
    if (!res->userid)
        goto tempfail;
    res->outcome = LMTP_SIEVE_DONE;
    c = lmtp_sieve_load(ls, fd, buf_cstring(&path));
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
    run.rcpt = rcpt;
    sieve_msg_ctx(&run.sm, &ctx);
    ctx.mailbox_exists = lmtp_sieve_cb_mailbox_exists;
    ctx.duplicate_check = lmtp_sieve_cb_duplicate;
    ctx.environment = lmtp_sieve_cb_environment;
    ctx.include = NULL;
    ctx.now = time(NULL);
    {
        struct tm tm;

        localtime_r(&ctx.now, &tm);
        ctx.zone_minutes = (int)(tm.tm_gmtoff / 60);
    }
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

    for (i = 0; i < acts.count && !tempfail; i++) {
        struct sieve_action *a = &acts.v[i];
        const char *why = NULL;
        struct buf one = BUF_INITIALIZER;

        switch (a->type) {
        case SIEVE_ACTION_KEEP:
            lmtp_sieve_add_target(res, mailbox, &a->flags);
            lmtp_sieve_log_action(&log, a->implicit ? "keep implicit"
                                                    : "keep");
            break;
        case SIEVE_ACTION_DISCARD:
            lmtp_sieve_log_action(&log, "discard");
            break;
        case SIEVE_ACTION_FILEINTO: {
            const char *target = NULL;
            int ok;

            if (lmtp_sieve_mboxname(&run, a->mailbox, &name) == 0) {
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
                    r = mboxlist_create(deliver_mboxlist(ls->dctx),
                                        buf_cstring(&name), NULL, NULL,
                                        NULL);
                    if (r == STORE_OK || r == STORE_EXISTS) {
                        target = buf_cstring(&name);
                        log_info("lmtp: sieve created mailbox=<%s> "
                                 "user=<%s>", target, res->userid);
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
            lmtp_sieve_add_target(res, target, &a->flags);
            buf_printf(&one, "fileinto \"%s\"", target);
            lmtp_sieve_log_action(&log, buf_cstring(&one));
            break;
        }
        case SIEVE_ACTION_REDIRECT:
            if (lmtp_sieve_redirect(&run, &ctx, a, &why) < 0)
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
            break;   /* editheader is not offered */
        }
        buf_free(&one);
    }
    sieve_msg_fini(&run.sm);
    if (tempfail)
        goto tempfail;
    goto done;

keep:
    lmtp_sieve_add_target(res, mailbox, NULL);
    lmtp_sieve_log_action(&log, "keep implicit");
    goto done;
tempfail:
    status = "tempfail";
    res->outcome = LMTP_SIEVE_TEMPFAIL;
done:
    log_sanitize(log.s ? log.s : "", log.len, clog, sizeof(clog));
    log_sanitize(rcpt, strlen(rcpt), crcpt, sizeof(crcpt));
    log_info("lmtp: sieve rcpt=<%s> user=<%s> script=<%s> result=<%s> "
             "actions=<%s>", crcpt, res->userid ? res->userid : "",
             scriptname, status, clog);
out:
    if (fd >= 0)
        close(fd);
    sieve_actions_fini(&acts);
    buf_free(&userid);
    buf_free(&inbox);
    buf_free(&path);
    buf_free(&err);
    buf_free(&log);
    buf_free(&name);
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
    free(res->reason);
    free(res->userid);
    free(res->dupsecs);
    strarray_fini(&res->dupmarks);
    memset(res, 0, sizeof(*res));
}
