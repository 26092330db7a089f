/*
 * lmtp_proxy.c - the frontend's LMTP client (see lmtp_proxy.h).
 *
 * Invariants: a pooled connection (b->p != NULL) is between
 * transactions: every command sent on it has had its reply read, so the
 * next transaction's replies are its own.  Any failure in the middle of
 * a transaction (a reply that cannot be read or parsed, a write error, a
 * file error while sending the message) closes the connection, and every
 * recipient without a reply yet gets the failure's 451; a recipient is
 * never told 250 unless its backend said 250 for it after the message.
 * Each reply is checked: 1 to 50 lines of at most PROXY_LINE_MAX bytes,
 * three digits 200..599 (the same on every line), then ' ' or '-' (the
 * last line ' ' or nothing).
 */
#include "config.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "lib/buf.h"
#include "lib/log.h"
#include "lib/netdial.h"
#include "lib/prot.h"
#include "lmtpd/lmtp_proxy.h"
#include "store/directory.h"

#define PROXY_LINE_MAX 2048
#define PROXY_REPLY_LINES 50
#define PROXY_CHUNK 65536
#define PROXY_HOLD_MS 5000      /* a backend that timed out is skipped */

#define R_NOCONNECT "451 4.4.1 Backend not reachable, try again later"
#define R_LOST "451 4.4.2 Backend connection lost, try again later"
#define R_GARBAGE "451 4.4.0 Backend protocol error, try again later"
#define R_LOCAL "451 4.3.0 Temporary failure, try again later"

enum proxy_err {
    PROXY_OK = 0,
    PROXY_CONNECT = -1,     /* could not connect, or no 220 greeting */
    PROXY_LOST = -2,        /* EOF, timeout, write error */
    PROXY_GARBAGE = -3,     /* not an LMTP reply, or one out of place */
    PROXY_LOCAL = -4        /* our side: the message file, memory */
};

struct proxy_backend {
    char *name;
    char *addr;
    int fd;                 /* -1 when not connected */
    struct prot *p;
    int kept;               /* served a transaction: RSET first */
    int timed_out;          /* this transaction waited proxy_timeout */
    uint64_t hold_until_ms; /* skipped (451 4.4.1) until then */
};

struct lmtp_proxy {
    const struct imapconf *conf;
    struct proxy_backend *b;
    size_t n;
    int timeout;
    char servername[256];
    struct buf line;
};

/* ---- backends ---------------------------------------------------------- */

int lmtp_proxy_new(const struct imapconf *conf, struct lmtp_proxy **px_r,
                   const char **error_r)
{
    struct lmtp_proxy *px = calloc(1, sizeof(*px));
    const char *s = imapconf_getstring(conf, "proxy_backends");

    *px_r = NULL;
    if (!px) {
        *error_r = "out of memory";
        return -1;
    }
    px->conf = conf;
    px->timeout = (int)imapconf_getint(conf, "proxy_timeout");
    imapconf_servername(conf, px->servername, sizeof(px->servername));
    {
        struct directory_peer *peers = NULL;
        size_t n = 0, i;

        if (directory_peers_parse(s, &peers, &n, error_r) != 0)
            goto fail;
        px->b = calloc(n ? n : 1, sizeof(*px->b));
        if (!px->b) {
            directory_peers_free(peers, n);
            *error_r = "out of memory";
            goto fail;
        }
        for (i = 0; i < n; i++) {       /* the names are the backends' now */
            px->b[i].name = peers[i].name;
            px->b[i].addr = peers[i].addr;
            px->b[i].fd = -1;
        }
        px->n = n;
        free(peers);
    }
    *px_r = px;
    return 0;
fail:
    lmtp_proxy_free(&px);
    return -1;
}

static void proxy_close(struct proxy_backend *b)
{
    prot_free(&b->p);
    if (b->fd >= 0)
        close(b->fd);
    b->fd = -1;
    b->kept = 0;
}

void lmtp_proxy_free(struct lmtp_proxy **pxp)
{
    struct lmtp_proxy *px = *pxp;
    size_t i;

    if (!px)
        return;
    for (i = 0; i < px->n; i++) {
        struct proxy_backend *b = &px->b[i];

        if (b->p) {
            prot_puts(b->p, "QUIT\r\n");
            (void)prot_flush(b->p);
        }
        proxy_close(b);
        free(b->name);
        free(b->addr);
    }
    free(px->b);
    buf_free(&px->line);
    free(px);
    *pxp = NULL;
}

int lmtp_proxy_find(const struct lmtp_proxy *px, const char *name)
{
    size_t i;

    for (i = 0; i < px->n; i++)
        if (px->b[i].name && strcmp(px->b[i].name, name) == 0)
            return (int)i;
    return -1;
}

const char *lmtp_proxy_name(const struct lmtp_proxy *px, int i)
{
    return px->b[i].name;
}

/* ---- connecting -------------------------------------------------------- */

static uint64_t proxy_now_ms(void)
{
    struct timespec ts;

    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* A connected socket to addr, or -1 with *why set; *timedout_r says
 * whether the last try ran out of time (the hold-down's reason). */
static int proxy_dial(const char *addr, int timeout, const char **why,
                      int *timedout_r)
{
    int fd = net_dial(addr, timeout, why);

    *timedout_r = fd < 0 && errno == ETIMEDOUT;
    return fd;
}

static void proxy_log(const struct proxy_backend *b, const char *step,
                      const char *error)
{
    log_warning("lmtp: backend failed backend=<%s> address=<%s> step=<%s> "
                "error=<%s>", b->name, b->addr, step, error);
}

/* Read one reply into out (sanitized lines joined by CRLF) and its code
 * into *code_r.  PROXY_OK, PROXY_LOST, PROXY_GARBAGE (logged). */
static int proxy_reply(struct lmtp_proxy *px, struct proxy_backend *b,
                       const char *step, struct buf *out, int *code_r)
{
    int code = -1, nlines = 0, r;

    buf_reset(out);
    for (;;) {
        const char *s;
        size_t len, i;
        int c;

        r = prot_getline(b->p, &px->line, PROXY_LINE_MAX, NULL);
        if (r == PROT_TOOLONG) {
            proxy_log(b, step, "reply line too long");
            return PROXY_GARBAGE;
        }
        if (r != PROT_OK) {
            if (r == PROT_TIMEOUT)
                b->timed_out = 1;
            proxy_log(b, step, r == PROT_EOF ? "connection closed"
                               : r == PROT_TIMEOUT ? "timeout"
                               : prot_error(b->p));
            return PROXY_LOST;
        }
        s = px->line.s ? px->line.s : "";
        len = px->line.len;
        if (len < 3 || s[0] < '2' || s[0] > '5' || s[1] < '0' ||
            s[1] > '9' || s[2] < '0' || s[2] > '9' ||
            (len > 3 && s[3] != ' ' && s[3] != '-')) {
            char clean[128];

            log_sanitize(s, len > 60 ? 60 : len, clean, sizeof(clean));
            log_warning("lmtp: backend failed backend=<%s> address=<%s> "
                        "step=<%s> error=<not an LMTP reply> reply=<%s>",
                        b->name, b->addr, step, clean);
            return PROXY_GARBAGE;
        }
        c = (s[0] - '0') * 100 + (s[1] - '0') * 10 + (s[2] - '0');
        if (code >= 0 && c != code) {
            proxy_log(b, step, "reply lines with different codes");
            return PROXY_GARBAGE;
        }
        code = c;
        if (nlines++)
            buf_appendcstr(out, "\r\n");
        for (i = 0; i < len; i++) {
            unsigned char ch = (unsigned char)s[i];

            buf_putc(out, ch < 32 || ch > 126 ? '?' : (char)ch);
        }
        if (len == 3 || s[3] == ' ')
            break;
        if (nlines >= PROXY_REPLY_LINES) {
            proxy_log(b, step, "reply of too many lines");
            return PROXY_GARBAGE;
        }
    }
    buf_cstring(out);
    *code_r = code;
    return PROXY_OK;
}

/* Connect, read the greeting, LHLO.  PROXY_OK or PROXY_CONNECT /
 * PROXY_LOST / PROXY_GARBAGE (logged; nothing left open). */
static int proxy_open(struct lmtp_proxy *px, struct proxy_backend *b,
                      struct buf *reply)
{
    const char *why = NULL;
    int code = 0, r;

    b->fd = proxy_dial(b->addr, px->timeout, &why, &b->timed_out);
    if (b->fd < 0) {
        proxy_log(b, "connect", why ? why : "failed");
        return PROXY_CONNECT;
    }
    b->p = prot_new(b->fd);
    if (!b->p) {
        proxy_close(b);
        return PROXY_LOCAL;
    }
    prot_settimeout(b->p, px->timeout);
    r = proxy_reply(px, b, "greeting", reply, &code);
    if (r == PROXY_OK && code != 220) {
        proxy_log(b, "greeting", "not 220");
        r = PROXY_CONNECT;
    }
    if (r == PROXY_OK) {
        prot_printf(b->p, "LHLO %s\r\n", px->servername);
        if (prot_flush(b->p) != PROT_OK) {
            proxy_log(b, "lhlo", prot_error(b->p));
            r = PROXY_LOST;
        } else {
            r = proxy_reply(px, b, "lhlo", reply, &code);
            if (r == PROXY_OK && code != 250) {
                proxy_log(b, "lhlo", "not 250");
                r = PROXY_GARBAGE;
            }
        }
    }
    if (r != PROXY_OK)
        proxy_close(b);
    return r;
}

/* A kept connection the backend has closed (or that holds bytes no
 * command asked for) polls readable between transactions. */
static int proxy_stale(const struct proxy_backend *b)
{
    struct pollfd pfd;

    if (prot_pending(b->p))
        return 1;
    pfd.fd = b->fd;
    pfd.events = POLLIN;
    pfd.revents = 0;
    return poll(&pfd, 1, 0) != 0;
}

/* ---- the transaction --------------------------------------------------- */

/* Send the message file dot-stuffed, then the end of data. */
static int proxy_send_message(struct proxy_backend *b, const char *path)
{
    char *chunk = malloc(PROXY_CHUNK);
    int fd, bol = 1, r = PROXY_OK;
    char last = '\n';

    if (!chunk)
        return PROXY_LOCAL;
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        log_error("lmtp: cannot read the message file path=<%s> "
                  "error=<%s>", path, strerror(errno));
        free(chunk);
        return PROXY_LOCAL;
    }
    for (;;) {
        ssize_t n = read(fd, chunk, PROXY_CHUNK);
        size_t i = 0;

        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            log_error("lmtp: cannot read the message file path=<%s> "
                      "error=<%s>", path, strerror(errno));
            r = PROXY_LOCAL;
            break;
        }
        if (n == 0)
            break;
        while (i < (size_t)n) {
            const char *nl = memchr(chunk + i, '\n', (size_t)n - i);
            size_t end = nl ? (size_t)(nl - chunk) + 1 : (size_t)n;

            if (bol && chunk[i] == '.')
                prot_write(b->p, ".", 1);
            prot_write(b->p, chunk + i, end - i);
            bol = nl != NULL;
            i = end;
        }
        last = chunk[n - 1];
    }
    close(fd);
    free(chunk);
    if (r != PROXY_OK)
        return r;
    if (last != '\n')
        prot_write(b->p, "\r\n", 2);
    prot_write(b->p, ".\r\n", 3);
    if (prot_flush(b->p) != PROT_OK) {
        proxy_log(b, "message", prot_error(b->p));
        return PROXY_LOST;
    }
    return PROXY_OK;
}

static const char *proxy_err_reply(int r)
{
    switch (r) {
    case PROXY_CONNECT:
        return R_NOCONNECT;
    case PROXY_LOST:
        return R_LOST;
    case PROXY_GARBAGE:
        return R_GARBAGE;
    default:
        return R_LOCAL;
    }
}

/* One backend's part of a message. */
struct proxy_txn {
    struct proxy_backend *b;
    struct lmtp_proxy_group *g;
    int *accepted;              /* per recipient: RCPT got 2xx */
    size_t naccepted;
    int r;                      /* PROXY_OK, or why it failed */
    int sent;                   /* the message went out: final replies due */
    struct buf reply, mail;
};

/* The transaction failed (r): close the connection; replies come later
 * (proxy_finish). */
static void proxy_fail(struct proxy_txn *t, int r)
{
    if (t->r == PROXY_OK)
        t->r = r;
    proxy_close(t->b);
}

/* Write [RSET] MAIL RCPT... DATA in one flush.  PROXY_OK or PROXY_LOST. */
static int proxy_pipeline(struct proxy_backend *b, const char *sender,
                          int smtputf8, uint64_t size,
                          const struct lmtp_proxy_group *g)
{
    size_t i;

    if (b->kept)
        prot_puts(b->p, "RSET\r\n");
    prot_printf(b->p, "MAIL FROM:<%s>%s SIZE=%llu\r\n", sender,
                smtputf8 ? " SMTPUTF8" : "", (unsigned long long)size);
    for (i = 0; i < g->n; i++)
        prot_printf(b->p, "RCPT TO:<%s>\r\n", g->rcpts[i]);
    prot_puts(b->p, "DATA\r\n");
    return prot_flush(b->p) == PROT_OK ? PROXY_OK : PROXY_LOST;
}

/* Phase 1: a connection (kept, or new) and the pipelined commands. */
static void proxy_begin(struct lmtp_proxy *px, struct proxy_txn *t,
                        const char *sender, int smtputf8, uint64_t size)
{
    struct proxy_backend *b = t->b;
    int r, attempt;

    b->timed_out = 0;
    if (b->hold_until_ms && proxy_now_ms() < b->hold_until_ms) {
        t->r = PROXY_CONNECT;   /* timed out a moment ago: not again yet */
        return;
    }
    b->hold_until_ms = 0;
    for (attempt = 0; attempt < 2; attempt++) {
        if (b->p && proxy_stale(b))
            proxy_close(b);
        if (!b->p && (r = proxy_open(px, b, &t->reply)) != PROXY_OK) {
            proxy_fail(t, r);
            return;
        }
        if (proxy_pipeline(b, sender, smtputf8, size, t->g) == PROXY_OK)
            return;
        if (!b->kept) {
            proxy_log(b, "mail", prot_error(b->p));
            proxy_fail(t, PROXY_LOST);
            return;
        }
        proxy_close(b);   /* a kept connection that died: a new one */
    }
}

/* Phase 2: the replies to [RSET] MAIL RCPT DATA, then the message. */
static void proxy_send_data(struct lmtp_proxy *px, struct proxy_txn *t,
                            const char *sender, int smtputf8, uint64_t size,
                            const char *path)
{
    struct proxy_backend *b = t->b;
    struct lmtp_proxy_group *g = t->g;
    int r, code = 0, mailcode = 0;
    size_t i;

    if (b->kept) {
        r = proxy_reply(px, b, "rset", &t->reply, &code);
        if (r == PROXY_LOST || (r == PROXY_OK && code == 421)) {
            /* closed by the backend before it took anything of this
             * transaction: once more on a new connection */
            log_info("lmtp: backend closed a kept connection, "
                     "reconnecting backend=<%s>", b->name);
            proxy_close(b);
            b->timed_out = 0;
            if ((r = proxy_open(px, b, &t->reply)) != PROXY_OK) {
                proxy_fail(t, r);
                return;
            }
            if (proxy_pipeline(b, sender, smtputf8, size, g) != PROXY_OK) {
                proxy_log(b, "mail", prot_error(b->p));
                proxy_fail(t, PROXY_LOST);
                return;
            }
        } else if (r != PROXY_OK || code != 250) {
            if (r == PROXY_OK)
                proxy_log(b, "rset", "not 250");
            proxy_fail(t, r == PROXY_OK ? PROXY_GARBAGE : r);
            return;
        }
    }
    /* MAIL */
    r = proxy_reply(px, b, "mail", &t->mail, &mailcode);
    if (r == PROXY_OK && mailcode / 100 == 3) {
        proxy_log(b, "mail", "unexpected 3xx");
        r = PROXY_GARBAGE;
    }
    if (r != PROXY_OK) {
        proxy_fail(t, r);
        return;
    }
    /* RCPT, one reply each */
    for (i = 0; i < g->n; i++) {
        r = proxy_reply(px, b, "rcpt", &t->reply, &code);
        if (r == PROXY_OK && code / 100 == 3) {
            proxy_log(b, "rcpt", "unexpected 3xx");
            r = PROXY_GARBAGE;
        }
        if (r != PROXY_OK) {
            proxy_fail(t, r);
            return;
        }
        if (mailcode / 100 != 2) {
            g->replies[i] = strdup(buf_cstring(&t->mail));
        } else if (code / 100 == 2) {
            t->accepted[i] = 1;
            t->naccepted++;
        } else {
            g->replies[i] = strdup(buf_cstring(&t->reply));
        }
    }
    /* DATA */
    r = proxy_reply(px, b, "data", &t->reply, &code);
    if (r != PROXY_OK) {
        proxy_fail(t, r);
        return;
    }
    if (code != 354) {
        if (code / 100 == 2) {
            proxy_log(b, "data", "2xx instead of 354");
            proxy_fail(t, PROXY_GARBAGE);
            return;
        }
        for (i = 0; i < g->n; i++)
            if (t->accepted[i])
                g->replies[i] = strdup(buf_cstring(&t->reply));
        b->kept = 1;   /* the transaction is over; the connection fine */
        return;
    }
    if (t->naccepted == 0) {
        /* 354 with no recipient: the backend and we disagree */
        proxy_log(b, "data", "354 without an accepted recipient");
        proxy_fail(t, PROXY_GARBAGE);
        return;
    }
    r = proxy_send_message(b, path);
    if (r != PROXY_OK) {
        proxy_fail(t, r);
        return;
    }
    t->sent = 1;
}

/* Phase 3: one reply per accepted recipient. */
static void proxy_final(struct lmtp_proxy *px, struct proxy_txn *t)
{
    struct lmtp_proxy_group *g = t->g;
    int r, code = 0;
    size_t i;

    for (i = 0; i < g->n; i++) {
        if (!t->accepted[i])
            continue;
        r = proxy_reply(px, t->b, "reply", &t->reply, &code);
        if (r == PROXY_OK && code / 100 == 3) {
            proxy_log(t->b, "reply", "unexpected 3xx");
            r = PROXY_GARBAGE;
        }
        if (r != PROXY_OK) {
            proxy_fail(t, r);
            return;
        }
        g->replies[i] = strdup(buf_cstring(&t->reply));
    }
    t->b->kept = 1;
}

void lmtp_proxy_send(struct lmtp_proxy *px, const char *sender,
                     int smtputf8, const char *path, uint64_t size,
                     struct lmtp_proxy_group *groups, size_t ngroups)
{
    struct proxy_txn *txns = calloc(ngroups ? ngroups : 1, sizeof(*txns));
    size_t i, j;

    for (i = 0; i < ngroups; i++)
        for (j = 0; j < groups[i].n; j++)
            groups[i].replies[j] = NULL;
    if (!txns)
        goto out;
    for (i = 0; i < ngroups; i++) {
        struct proxy_txn *t = &txns[i];

        t->b = &px->b[groups[i].backend];
        t->g = &groups[i];
        t->accepted = calloc(groups[i].n ? groups[i].n : 1,
                             sizeof(*t->accepted));
        if (!t->accepted)
            t->r = PROXY_LOCAL;
    }
    /* every backend gets its commands, then its message, before any
     * final reply is awaited: the backends store in parallel */
    for (i = 0; i < ngroups; i++)
        if (txns[i].r == PROXY_OK)
            proxy_begin(px, &txns[i], sender, smtputf8, size);
    for (i = 0; i < ngroups; i++)
        if (txns[i].r == PROXY_OK)
            proxy_send_data(px, &txns[i], sender, smtputf8, size, path);
    for (i = 0; i < ngroups; i++)
        if (txns[i].r == PROXY_OK && txns[i].sent)
            proxy_final(px, &txns[i]);
    for (i = 0; i < ngroups; i++) {
        struct proxy_txn *t = &txns[i];

        if (t->r != PROXY_OK && t->b->timed_out) {
            t->b->hold_until_ms = proxy_now_ms() + PROXY_HOLD_MS;
            log_warning("lmtp: backend held down after a timeout "
                        "backend=<%s> seconds=<%d>", t->b->name,
                        PROXY_HOLD_MS / 1000);
        }
        for (j = 0; j < t->g->n; j++)
            if (!t->g->replies[j] && t->r != PROXY_OK)
                t->g->replies[j] = strdup(proxy_err_reply(t->r));
        free(t->accepted);
        buf_free(&t->reply);
        buf_free(&t->mail);
    }
out:
    free(txns);
}
